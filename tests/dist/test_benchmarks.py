"""Every `scripts/bench_*.py` runs, as a user runs it, at the smallest size that goes through its
code path, and prints its figures as ratios against a reference measured in the same run.

The benchmarks' speed targets are shown by those ratios; nothing here judges a ratio's value (a
loaded machine moves it), only that the script finished and printed it as a finite positive
number. What these runs guard is the code: a benchmark that wraps a renamed function
(`bench_checkpoint`'s phases), builds a batch the trainer no longer takes, or prints no ratio
fails here, not on the day someone measures. `scripts/bench_search.py` has its own test.

Each script computes on one core, so the module's fixture runs the selected tests' scripts side
by side, one per core (tests/side_by_side.py): a ratio measured beside another script moves, and
none is judged.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

from tests.dist.prepared_data import write_blend, write_byte_dataset
from tests.side_by_side import run_child, selected_tests, side_by_side

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"([0-9][0-9,]*\.?[0-9]*(?:e[-+]?[0-9]+)?)"
# bench_data's corpus: a tenth of a MiB of synthetic text and a BPE of 300 tokens.
SMALL_CORPUS = ["corpus=synthetic", "max_mb=0.1", "vocab=300", "repeats=1"]
# Each test's script `test_bench_<name>_prints...`: (script, arguments, the exit codes that mean
# it finished; 1 where the script says it missed a goal, a verdict on speed, not a failure).
# "{dir}" is a folder of its own, "{blend}" a small prepared corpus's blend. Longest first.
BENCHES = {
    "documents": ("bench_documents.py", ["blend={blend}", "steps=3"], (0,)),
    "data_memory": ("bench_data.py", ["memory=true", *SMALL_CORPUS], (0, 1)),
    "step": ("bench_step.py", ["recipe=tiny_dp1", "steps=5", "warmup=1", "run_dir={dir}"], (0,)),
    "checkpoint": ("bench_checkpoint.py", ["size=tiny", "recipe=tiny_dp1",
                                           "optimizer.distributed=true", "repeats=1", "steps=1",
                                           "run_dir={dir}"], (0,)),
    "data": ("bench_data.py", SMALL_CORPUS, (0, 1)),
    "packing": ("bench_packing.py", ["documents=2000"], (0, 1)),
}


def bench_of(test: str) -> str | None:
    return next((name for name in BENCHES if test.startswith(f"test_bench_{name}_prints")), None)


@pytest.fixture(scope="module")
def outputs(request, tmp_path_factory) -> dict:
    """{name: the finished script} for every benchmark a selected test reads, run side by side
    from the repository root, as a user runs them."""
    wanted = [name for name in BENCHES if name in map(bench_of, selected_tests(request))]
    root = tmp_path_factory.mktemp("benches")
    # documents: three `scripts/pretrain.py` runs of three steps (the fewest it takes) on it
    blend = write_blend(root, write_byte_dataset(root)) if "documents" in wanted else ""
    with side_by_side() as pool:
        started = {name: pool.submit(run_child, [
            sys.executable, str(REPO / "scripts" / BENCHES[name][0]),
            *(a.format(dir=root / name, blend=blend) for a in BENCHES[name][1])])
            for name in wanted}
    return {name: future.result() for name, future in started.items()}


def output_of(outputs: dict, name: str) -> str:
    """The benchmark's stdout, once it finished with one of its exit codes."""
    done = outputs[name]
    assert done.returncode in BENCHES[name][2], (done.returncode, done.stdout[-3000:],
                                                 done.stderr[-3000:])
    return done.stdout


def ratio(output: str, pattern: str) -> float:
    """The number `pattern` (a regex whose one group is NUMBER) finds in `output`: it must be
    there, finite and positive."""
    found = re.search(pattern, output)
    assert found, f"no line matching {pattern!r} in:\n{output[-3000:]}"
    value = float(found.group(1).replace(",", ""))
    assert math.isfinite(value) and value > 0, (pattern, value)
    return value


def test_bench_step_prints_our_step_against_a_bare_megatron_step(outputs):
    output = output_of(outputs, "step")
    ratio(output, rf"ratio {NUMBER} \(median of 5 after 1 warm-up\)")
    ratio(output, rf"per interleaved pair {NUMBER} median, {NUMBER}-{NUMBER} spread over 5 pairs")
    ratio(output, rf"on a batch in memory \(no read\) {NUMBER} ms/step, ratio {NUMBER}")


def test_bench_checkpoint_prints_save_and_load_against_dd_and_the_async_stall(outputs):
    """One rank with the distributed optimizer (the default recipe's optimizer, its phases
    wrapped), one save and load, one normal step, then the three async saves."""
    output = output_of(outputs, "checkpoint")
    row = next(line for line in output.splitlines() if line.startswith("  first "))
    against_dd = [ratio(part, rf"\({NUMBER}x\)") for part in re.findall(r"\([^()]*x\)", row)]
    assert len(against_dd) == 2  # save / dd, load / dd
    stalls = [line for line in output.splitlines() if "x less than off" in line]
    assert len(stalls) == 3
    for line in stalls:
        ratio(line, rf"\({NUMBER}x less than off\)")


def test_bench_data_prints_the_pipeline_against_the_bare_tokenizer_and_one_worker(outputs):
    output = output_of(outputs, "data")
    ratio(output, rf"ratio pipeline / encode_batch: +{NUMBER}")
    ratio(output, rf"ratio pipeline / encode_batch_fast: +{NUMBER}")
    ratio(output, rf"ratio 2 workers / 1 worker: +{NUMBER}")


def test_bench_data_memory_prints_the_10x_peak_against_the_1x_peak(outputs):
    output = output_of(outputs, "data_memory")
    ratio(output, rf"ratio peak per worker 10x / 1x: +{NUMBER}")


def test_bench_packing_prints_packs_over_the_bound_next_fit_and_the_order_against_v1(outputs):
    output = output_of(outputs, "packing")
    for size in (4096, 8192):
        section = output.split(f"pack {size}:", 1)[1]
        ratio(section, rf"packs/bound {NUMBER}")
        ratio(section, rf"time next-fit/best-fit {NUMBER}x")
    ratio(output, rf"time v1/megatron {NUMBER}x")


def test_bench_documents_prints_each_mode_against_concatenate(outputs):
    """Three `scripts/pretrain.py` runs of three steps (the fewest it takes) on a small
    prepared corpus."""
    output = output_of(outputs, "documents")
    for mode in ("inter_document", "packed"):
        ratio(output, rf"ratio {mode} / concatenate: step time {NUMBER},")
        ratio(output, rf"ratio {mode} / concatenate: step time [^,]*, effective tokens/s "
                      rf"{NUMBER}")


def test_every_benchmark_script_has_a_test_here():
    """A new `scripts/bench_*.py` gets a test (bench_search.py has its own)."""
    here = Path(__file__).read_text()
    scripts = sorted(path.name for path in (REPO / "scripts").glob("bench_*.py"))
    untested = [name for name in scripts
                if name != "bench_search.py" and f'"{name}"' not in here]
    assert scripts and not untested
