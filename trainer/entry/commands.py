"""Every script's command object: its options, and what it runs.

`scripts/<name>.py` is a docstring (its usage) and `main(<COMMAND>)` (trainer/entry/contract.py).
Training commands run the training pipeline (trainer/entry/pipeline.py) with a rank function;
the others run here, in this process. Heavy imports stay inside the functions, so `--help` and
every refusal stay fast (under a second, no torch).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from plugins.protocol.errors import EXIT_FAULT, ConfigError
from recipes.config.schema import RunConfig
from trainer.entry.contract import Arguments, Command, Option, non_negative, positive
from trainer.entry.pipeline import Training

CONFIG_REST = "recipe=NAME | config=FILE, then section.field=value overrides"


def scripts_taking(key: str) -> list[str]:
    """The scripts whose own option `key=` is: a recipe command's lookup (`option_owners`) for
    a word it would otherwise hand on as a config override (`pretrain.py search=true`)."""
    return [command.script for command in COMMANDS if key in command.options]


def recipe_command(script: str, run: Callable[[Arguments], int], **fields: Any) -> Command:
    """A command that takes a recipe (or a saved config) and overrides: another script's option
    given to it (`pretrain.py search=true`) is named as that script's (`scripts_taking`), not
    handed on as an unknown config key. The contract knows no other command, so the lookup is
    handed in here, once for every such command."""
    return Command(script, run, takes_recipe=True, option_owners=scripts_taking, **fields)


# --- training commands: a rank function each ------------------------------------------------

def pretrain_rank(cfg: RunConfig, run_dir: Path, args: Arguments) -> int:
    """Train on this rank, then print and record the summary (rank 0)."""
    import torch

    from trainer.loop import run_training
    from trainer.metrics import RunReporter
    from trainer.session import start_session
    from trainer.step_clock import run_peak
    from trainer.summary import build_summary, print_summary

    session = start_session(cfg, run_dir)
    log = cfg.logging
    reporter = RunReporter(run_dir, cfg.train.train_iters, log.log_interval, log.progress_bar,
                           run_peak(cfg))
    with reporter:
        history = run_training(session, reporter)
    summary = build_summary(session, history)
    session.plugins.run_end(summary)
    if torch.distributed.get_rank() == 0:
        print_summary(summary, reporter.console)
        reporter.record("summary", summary)
    return 0


def bench_step_rank(cfg: RunConfig, run_dir: Path, args: Arguments) -> int:
    """Alternate our step and a bare Megatron Core step; rank 0 prints medians and ratio."""
    import torch

    from trainer.session import start_session
    from trainer.tools.benchmarks.step import compare_step_times

    session = start_session(cfg, run_dir)
    figures = compare_step_times(session, args["steps"], args["warmup"])
    if torch.distributed.get_rank() == 0:
        print(
            f"bench {cfg.name}: ours {figures['ours_s'] * 1e3:.1f} ms/step, bare Megatron Core "
            f"{figures['bare_s'] * 1e3:.1f} ms/step, ratio {figures['ratio']:.3f} "
            f"(median of {figures['steps']} after {figures['warmup']} warm-up); per "
            f"interleaved pair {figures['pair_ratio_median']:.3f} median, "
            f"{figures['pair_ratio_min']:.3f}-{figures['pair_ratio_max']:.3f} spread over "
            f"{figures['pairs']} pairs; against the bare step on a batch in memory (no read) "
            f"{figures['bare_in_memory_s'] * 1e3:.1f} ms/step, ratio "
            f"{figures['ratio_in_memory']:.3f}, per pair {figures['in_memory_ratio_median']:.3f} "
            f"median, {figures['in_memory_ratio_min']:.3f}-{figures['in_memory_ratio_max']:.3f}"
        )
        print(json.dumps(figures))
    return 0


def validate_resume_rank(cfg: RunConfig, run_dir: Path, args: Arguments) -> int:
    """Continuous vs resumed on every rank; rank 0 prints the table. Exit 1 on any failure."""
    import torch

    from trainer.tools.resume_check import format_table, run_resume_check

    rows = run_resume_check(cfg, run_dir, args.options)
    if torch.distributed.get_rank() == 0:
        print(format_table(cfg.name, rows, args.options), flush=True)
    return 0 if all(ok for *_, ok in rows) else 1


def megatron_parity_rank(cfg: RunConfig, run_dir: Path, args: Arguments) -> int:
    """This trainer and Megatron-LM's loop on every rank; rank 0 prints the comparison. Exit 1
    when the final weights are not bit-identical."""
    import torch

    from trainer.tools.megatron_parity import format_report, run_parity_check

    report = run_parity_check(cfg, run_dir, args["steps"])
    if torch.distributed.get_rank() == 0:
        print(format_report(cfg.name, report), flush=True)
    return 0 if report.bit_identical else 1


def check_parity_recipe(args: Arguments) -> None:
    """What the parity check cannot compare is refused before any rank starts (torch-free)."""
    from recipes.resolve import resolve_config
    from trainer.tools.parity_scope import unsupported

    problem = unsupported(resolve_config(list(args.rest)))
    if problem:
        raise ConfigError(problem)


def check_resume_options(args: Arguments) -> None:
    """The resume check saves inside the run it compares with, from step 0 (torch-free)."""
    from recipes.resolve import resolve_config
    from trainer.tools.resume_check import resume_check_refusal

    if args["save_at"] >= args["steps"]:
        raise ConfigError(f"save_at={args['save_at']} must be below steps={args['steps']}, "
                          f"e.g. steps={args['save_at'] + 3}")
    problem = resume_check_refusal(resolve_config(list(args.rest)))
    if problem:
        raise ConfigError(problem)


def bench_checkpoint_rank(cfg: RunConfig, run_dir: Path, args: Arguments) -> int:
    from trainer.tools.benchmarks.checkpoint import bench_checkpoint_rank as rank

    return rank(cfg, run_dir, args)


BENCH_CHECKPOINT_RECIPE = "tiny_dp2_distopt"  # 2 ranks, the distributed optimizer
SIZE_100M = [
    "model.num_layers=12", "model.hidden_size=768", "model.ffn_hidden_size=3072",
    "model.num_attention_heads=12", "model.vocab_size=20480",
    "train.micro_batch_size=1", "train.global_batch_size=2",
]


def checkpoint_sizes(args: Arguments) -> list[list[str]]:
    """One launch per size asked for (each its own ranks): tiny is the recipe as it is."""
    named = any(arg.startswith(("recipe=", "config=")) for arg in args.rest)
    recipe = [] if named else [f"recipe={BENCH_CHECKPOINT_RECIPE}"]
    sizes = {"tiny": [[]], "100m": [SIZE_100M], "both": [[], SIZE_100M]}[args["size"]]
    return [[*recipe, *size] for size in sizes]


def pretrain(args: Arguments) -> int:
    """Train; or with `print=config` print the resolved config (YAML), with
    `print=megatron_args` the Megatron-LM command line that trains the same thing, with
    `check=paths` check the paths the run names where it runs (nothing starts)."""
    if args["print"] == "megatron_args":
        from recipes.config.megatron_args import command_text
        from recipes.resolve import resolve_config

        print(command_text(resolve_config(list(args.rest))))
        return 0
    if args["print"] == "config":
        from recipes.config.io import resolved_yaml
        from recipes.resolve import resolve_config
        from trainer.throughput import RUN_RULES

        print(resolved_yaml(resolve_config(list(args.rest), rules=RUN_RULES)), end="")
        return 0
    if args["check"] == "paths":
        from trainer.entry.pipeline import check_paths

        return check_paths(args)
    return Training(pretrain_rank, phased=True, dry_runs=True)(args)


PRETRAIN = recipe_command(
    script="pretrain.py", run=pretrain, rest=CONFIG_REST,
    options={"print": Option(None, "config: print the resolved config (every field, as YAML, "
                             "the form config=FILE reads) and start nothing; megatron_args: "
                             "print the Megatron-LM pretrain_gpt.py command line training the "
                             "same thing (pretrain_hybrid.py for a hybrid, with its layer "
                             "pattern, Mamba sizes and MoE routing), and start nothing",
                             type=Literal["megatron_args", "config"] | None),
             "check": Option(None, "paths: check every path the run names (data, checkpoint, "
                             "run directory, cluster file) on this machine, each problem in "
                             "one line, and start nothing: a Slurm job's first step",
                             type=Literal["paths"] | None)})

def at_least_pairs(key: str, value: int) -> str | None:
    """`check` for bench_step's rounds: a ratio's median and spread need five pairs."""
    from trainer.tools.benchmarks.step import MIN_PAIRS

    if value < MIN_PAIRS:
        return (f"{key}={value} is too few interleaved pairs for a median and spread; use "
                f"{key}={MIN_PAIRS} or more")
    return None


BENCH_STEP = recipe_command(
    script="bench_step.py", run=Training(bench_step_rank), rest=CONFIG_REST,
    options={"steps": Option(20, "measured rounds of each step (interleaved pairs, at least 5)",
                             check=at_least_pairs),
             "warmup": Option(3, "rounds discarded first", check=positive)})

VALIDATE_RESUME = recipe_command(
    script="validate_resume.py", run=Training(validate_resume_rank, check=check_resume_options),
    rest=CONFIG_REST,
    options={"steps": Option(6, "steps of each run", check=positive),
             "save_at": Option(3, "the step after which the checkpoint is saved",
                               check=positive)})

CHECK_MEGATRON_PARITY = recipe_command(
    script="check_megatron_parity.py", run=Training(megatron_parity_rank,
                                                    check=check_parity_recipe), rest=CONFIG_REST,
    options={"steps": Option(20, "steps of each run", check=positive)})

BENCH_CHECKPOINT = recipe_command(
    script="bench_checkpoint.py", run=Training(bench_checkpoint_rank, checkpoint_sizes),
    rest=CONFIG_REST, default_recipe=BENCH_CHECKPOINT_RECIPE,
    options={"size": Option("both", "tiny (the recipe), 100m (about 100M parameters) or both",
                            type=Literal["tiny", "100m", "both"]),
             "repeats": Option(3, "timed save+load rounds (the first is reported apart)",
                               check=positive),
             "steps": Option(3, "normal steps timed before the async save", check=positive)})


# --- the planner, the launcher and the scaling harness ---------------------------------------

def run_plan(args: Arguments) -> int:
    from recipes.plan.command import run_plan as plan

    def dry_run_shards(cfg):  # verify=true: the real model of every distinct shard, on meta
        from trainer.tools.dry_run import collect_shards

        return collect_shards(cfg)

    def megatron_config(path, cluster):  # megatron_args=FILE: Megatron-LM's own parser
        from trainer.tools.megatron_args import config_from_megatron_args, read_launch_file

        argv, launched = read_launch_file(path)
        return config_from_megatron_args(argv, cluster, source=path, launched=launched)

    def confirm(cfg, top, steps):  # search=true confirm=K: the scaling harness's short runs
        from trainer.tools.search_confirm import run_confirm

        return run_confirm(cfg, top, steps)

    def calibrate(cluster, dtype, path, cfg):  # calibrate=true: GEMMs, comm, cores
        from trainer.tools.calibrate import calibrate_cluster_file

        return calibrate_cluster_file(cluster, dtype, path, cfg)

    return plan(list(args.rest), args.options, args.given, as_json="--json" in args.flags,
                build_shards=dry_run_shards, read_megatron=megatron_config, confirm=confirm,
                calibrate=calibrate)


def positive_number(key: str, value: float | None) -> str | None:
    if value is not None and value <= 0:
        return f"{key}={value} must be a positive number, e.g. {key}=0.4"
    return None


def share_of_peak(key: str, value: float | None) -> str | None:
    """A share of the GPUs' peak FLOP/s: above 0, and no step reaches more than all of it."""
    if value is not None and not 0 < value <= 1:
        return f"{key}={value} is a share of the peak FLOP/s, above 0 and at most 1, e.g. {key}=0.4"
    return None


PLAN = recipe_command(
    script="plan.py", run=run_plan, rest=CONFIG_REST, flags=("--json",),
    options={
        "cluster": Option(None, "conf/cluster/*.yaml: GPUs per node, memory, bandwidths, peak "
                          "TFLOP/s (null: the recipe's cluster section, the H100 network)",
                          type=str | None),
        "sharding": Option(None, "optimizer sharding (null: dist_opt with "
                           "optimizer.distributed=true, else none)",
                           type=Literal["none", "dist_opt", "optim", "optim_grads",
                                        "optim_grads_params"] | None),
        "offload": Option(False, "optimizer state (FP32 master, Adam moments) in CPU memory",
                          type=bool),
        "attention": Option(None, "attention kernel (null: the cluster file's)",
                            type=Literal["flash", "explicit"] | None),
        "fp8_weights": Option(False, "FP8 training that keeps FP8 weights (false: BF16 weights)",
                              type=bool),
        "tokens": Option(None, "token budget: steps and GPU-hours, e.g. 15e12", type=int | None,
                         check=positive),
        "mfu": Option(0.4, "share of peak FLOP/s for the step-time estimate", type=float,
                      check=share_of_peak),
        "groups": Option(None, "write out at most N groups of each kind (null: all)",
                         type=int | None, check=positive),
        "verify": Option(False, "also build every distinct shard on the meta device and "
                         "compare", type=bool),
        "megatron_args": Option(None, "a file of Megatron-LM pretrain_gpt.py or "
                                "pretrain_hybrid.py arguments to plan instead of a recipe (read "
                                "by Megatron-LM's own parser)",
                                type=str | None),
        "search": Option(False, "search every accepted layout of the model on the cluster and "
                         "rank those that fit by modeled step time", type=bool),
        "top": Option(10, "layouts the search lists", check=positive),
        "confirm": Option(0, "with search=true: run the top K layouts for a few steps each on "
                          "local ranks and re-rank them by measured step time",
                          check=non_negative),
        "confirm_steps": Option(6, "steps of each confirm run", check=positive),
        "confirm_pick": Option("top", "which layouts confirm= runs: top (the K fastest "
                               "predicted, to choose one) or spread (K over the whole ranking, "
                               "to check the step model)", type=Literal["top", "spread"]),
        "calibrate": Option(False, "measure this machine's GEMM throughput by shape, its "
                            "collective bandwidth and latency, kernel overhead and cores, and "
                            "write them into the cluster= file (gemm_peak_fraction, "
                            "gemm_half_dim, intra_node_gb_per_s, collective_latency_us, "
                            "kernel_overhead_us, host_cores)", type=bool),
    })


def _port(key: str, value: int | None) -> str | None:
    from trainer.launch.cluster import check_port

    return check_port(key, value)


LAUNCH_OPTIONS = {
    "cluster": Option(None, "conf/cluster/<name>.yaml", type=str | None),
    "executor": Option("slurm", "slurm (sbatch) or local (torchrun here)",
                       type=Literal["slurm", "local"]),
    "retries": Option(0, "times Slurm requeues a failed job", check=non_negative),
    "rdzv_port": Option(None, "c10d rendezvous port (default: derived at launch)",
                        type=int | None, check=_port),
    "account": Option(None, "Slurm account (null: the cluster file's account:)",
                      type=str | None),
    "partition": Option(None, "Slurm partition (null: the cluster file's partition:)",
                        type=str | None),
    "time": Option(None, "Slurm time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                   "D-HH:MM:SS (null: the cluster file's time:, else 04:00:00)", type=str | None),
    "job_dir": Option(None, "where NeMo-Run lays out jobs (shared storage)", type=str | None),
    "container_image": Option(None, "run the job in this container image (pyxis; null: the "
                              "cluster file's container_image:, else no container)",
                              type=str | None),
    "container_mounts": Option(None, "more container mounts, SRC[:DST[:FLAGS]],... (added to "
                               "the cluster file's and to what the run needs: data, run and "
                               "job directories, this checkout)", type=str | None),
    "container_python": Option(None, "the Python the container job runs (null: the image's "
                               "python3; e.g. a virtualenv's bin/python on shared storage, "
                               "which is then mounted)", type=str | None),
}
LAUNCH_FLAGS = ("--dry-run", "--dry_run")


def run_launch(args: Arguments) -> int:
    from trainer.launch.cluster import launch_args
    from trainer.launch.cluster import run_launch as launch

    return launch(launch_args(args.options, args.flags, args.rest, args.given))


LAUNCH = recipe_command(script="launch.py", run=run_launch, rest=CONFIG_REST,
                        options=LAUNCH_OPTIONS, flags=LAUNCH_FLAGS)


def _world_sizes(key, value):
    from trainer.tools.scaling.report import check_world_sizes

    return check_world_sizes(key, value)


def _scaling_steps(key, value):
    from trainer.tools.scaling.report import check_steps

    return check_steps(key, value)


def _token_budget(key, value):
    from trainer.tools.scaling.report import check_token_budget

    return check_token_budget(key, value)


def run_scaling(args: Arguments) -> int:
    from trainer.entry.pipeline import preflight  # each local size's, before the first runs
    from trainer.launch.cluster import launch_args
    from trainer.tools.scaling.checks import inapplicable_problem
    from trainer.tools.scaling.report import scaling_options
    from trainer.tools.scaling.sweep import run_scaling as sweep

    problem = inapplicable_problem(args.options, args.given, args.flags, args.rest)
    if problem:  # an option that would be ignored: said before anything runs
        raise ConfigError(problem)
    launch = None
    if args["cluster"] is not None or set(args.flags) & set(LAUNCH_FLAGS):
        launch = launch_args(args.options, args.flags, args.rest, args.given)
    return sweep(scaling_options(args.options), launch, list(args.rest), preflight=preflight)


SCALING = recipe_command(
    script="scaling.py", run=run_scaling, rest=CONFIG_REST, flags=LAUNCH_FLAGS,
    options={
        "scaling.world_sizes": Option([1, 2, 4], "rank counts to run", type=list[int],
                                      check=_world_sizes),
        "scaling.mode": Option("weak", "weak (per-replica batch fixed) or strong (global batch "
                               "fixed)", type=Literal["weak", "strong"]),
        "scaling.steps": Option(8, "steps per size (warm-up and profiled ones included)",
                                check=_scaling_steps),
        "scaling.cluster": Option(None, "cluster file whose peak gives MFU", type=str | None),
        "scaling.token_budget": Option(1e9, "tokens the time and GPU-hours columns are for",
                                       type=float, check=_token_budget),
        "scaling.out": Option(None, "report directory", type=str | None),
        "scaling.report": Option(None, "write the report of a finished sweep directory",
                                 type=str | None),
        **LAUNCH_OPTIONS,
    })


# --- conversion, pictures, data ----------------------------------------------------------------

def run_convert(args: Arguments) -> int:
    """Import or export; the last line gives seconds and peak memory."""
    from rich.console import Console

    from trainer.interop import cli

    request = cli.make_request(args.rest, args.options)
    cfg = cli.import_config(request) if request.command == "import" else None
    cli.run(request, cfg, Console())
    return 0


def hf_architectures() -> str:
    """convert.py --help: every Hugging Face architecture the import and export map (the one
    list, `ARCHITECTURES` in trainer/interop/hf_config.py), each with the recipes whose model
    exports as it (what `hf_config_for` writes), and the recipes no architecture fits."""
    import textwrap

    from recipes.registry import RECIPES, get_recipe
    from trainer.interop.hf_config import ARCHITECTURES, hf_config_for

    of_architecture: dict[str, list[str]] = {name: [] for name in ARCHITECTURES}
    unmapped = []
    for recipe in RECIPES:
        try:
            config = hf_config_for(get_recipe(recipe).model, "bfloat16")
        except ConfigError:  # not Llama-, Mixtral- or NemotronH-shaped
            unmapped.append(recipe)
            continue
        of_architecture.setdefault(config["architectures"][0], []).append(recipe)
    lines = ["Hugging Face architectures (config.json's `architectures`), both ways, with the "
             "recipes of each:"]
    rows = [*((f"{name} ({ARCHITECTURES[name][0] if name in ARCHITECTURES else '?'})", recipes)
              for name, recipes in of_architecture.items()),
            ("no architecture", unmapped)]
    for label, recipes in rows:
        lines.append(textwrap.fill(", ".join(recipes) or "-", width=100,
                                   initial_indent=f"  {label}: ", subsequent_indent="      "))
    return "\n".join(lines)


CONVERT = recipe_command(
    script="convert.py", run=run_convert, handles=hf_architectures,
    rest="import|export, then (import) recipe=NAME | config=FILE and overrides",
    # The local layer spec names the weights: conversion runs on CPU, CUDA hidden.
    environment={"CUDA_VISIBLE_DEVICES": ""},
    options={
        "hf": Option(None, "import: a Hugging Face model directory", type=str | None),
        "checkpoint": Option(None, "export: a run's checkpoints or one step directory",
                             type=str | None),
        "out": Option(None, "a new output directory", type=str | None),
        "max_shard_size": Option(None, "export: bytes per safetensors shard (default 5 GiB; "
                                 "e.g. 2147483648 for 2 GiB)", type=int | None, check=positive),
    })


def picture_out_problem(key: str, value: str) -> str | None:
    """compare_runs.py's `out=` is a file it can write (`output_file_problem`): said before any
    run is read or drawn, not as matplotlib's traceback at the save."""
    from recipes.config.path_rules import output_file_problem

    return output_file_problem(key, value, f"name a .png file in a folder you can write, e.g. "
                                           f"{key}={Path.cwd() / 'compare_runs.png'}")


def run_compare_runs(args: Arguments) -> int:
    from trainer.tools.compare_runs import compare_runs

    problem = picture_out_problem("out", args["out"])  # the default's folder too
    if problem:
        raise ConfigError(problem)
    print(f"wrote {compare_runs(args.rest, args['out'])}")
    return 0


COMPARE_RUNS = Command(script="compare_runs.py", run=run_compare_runs, rest="RUN_DIR ...",
                       options={"out": Option("compare_runs.png", "the picture (.png)",
                                              type=str)})


def run_prepare_data(args: Arguments) -> int:
    from data_prep.config import parse_args, validate

    started = time.perf_counter()
    cfg = parse_args(list(args.rest))
    validate(cfg)  # before the heavy imports: a mistake is refused in about a second
    from data_prep.executors import WorkerLost
    from data_prep.prepare import prepare, print_summary

    try:
        print_summary(prepare(cfg))
    except WorkerLost as lost:
        print(f"error: {lost}", file=sys.stderr, flush=True)
        return EXIT_FAULT
    print(f"done in {time.perf_counter() - started:.1f} s (imports included)", flush=True)
    return 0


PREPARE_DATA = Command(script="prepare_data.py", run=run_prepare_data,
                       rest="key=value arguments of the preparation (see above)")


# --- benchmarks and the GPU check ----------------------------------------------------------------

def run_bench_data(args: Arguments) -> int:
    from trainer.tools.benchmarks.data import run_bench_data as bench

    return bench(args.options)


BENCH_DATA = Command(
    script="bench_data.py", run=run_bench_data,
    environment={"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"},  # one core
    options={"corpus": Option("stdlib", "the stdlib's sources or synthetic word salad",
                              type=Literal["stdlib", "synthetic"]),
             "max_mb": Option(8.0, "MiB of text (a fraction for a quick run)", type=float,
                              check=positive_number),
             "vocab": Option(32000, "tokens of the BPE trained first", check=positive),
             "repeats": Option(5, "timed repeats", check=positive),
             "tokenizer": Option(None, "a tokenizer.json instead of training one",
                                 type=str | None),
             "megatron_lm": Option(None, "Megatron-LM's tools/preprocess_data.py to compare "
                                   "with", type=str | None),
             "workers": Option(2, "workers of the comparison with Megatron-LM",
                               check=positive),
             "memory": Option(False, "instead: peak memory per worker at 1x and 10x the corpus",
                              type=bool),
             "format": Option("jsonl", "memory=true: the corpus files' format",
                              type=Literal["jsonl", "gz", "zst", "parquet"])})


def at_least_three(key: str, value: int) -> str | None:
    if value < 3:
        return f"{key}={value} must be 3 or more (the first 2 steps are left out), e.g. {key}=20"
    return None


def run_bench_documents(args: Arguments) -> int:
    from trainer.tools.benchmarks.documents import run_bench_documents as bench

    if args["blend"] is None:
        raise ConfigError("give blend=<file>, e.g. blend=conf/data/python_stdlib.yaml")
    return bench(args["blend"], args["steps"], args["recipe"])


BENCH_DOCUMENTS = Command(
    script="bench_documents.py", run=run_bench_documents,
    options={"blend": Option(None, "the blend file whose training datasets are measured",
                             type=str | None),
             "steps": Option(20, "training steps per mode", check=at_least_three),
             "recipe": Option("tiny_dp1", "the recipe trained", type=str)})


def run_bench_packing(args: Arguments) -> int:
    from trainer.tools.benchmarks.packing import run_bench_packing as bench

    return bench(args["documents"], args["seed"])


BENCH_PACKING = Command(
    script="bench_packing.py", run=run_bench_packing,
    environment={name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                        "MKL_NUM_THREADS")},  # one thread, before numpy loads
    options={"documents": Option(1_000_000, "documents to pack", check=positive),
             "seed": Option(0, "seed of the document lengths", check=non_negative)})


def run_bench_search(args: Arguments) -> int:
    from trainer.tools.benchmarks.search import run_bench_search as bench

    return bench(list(args.rest), args["cluster"], args["top"], args["repeats"])


BENCH_SEARCH = recipe_command(
    script="bench_search.py", run=run_bench_search, rest=CONFIG_REST,
    options={"cluster": Option(None, "conf/cluster/*.yaml the search plans on (null: the "
                               "recipe's cluster section)", type=str | None),
             "top": Option(10, "layouts whose ranking both searches must agree on",
                           check=positive),
             "repeats": Option(3, "timed runs of each search, in turn", check=positive)})


def run_gpu_check(args: Arguments) -> int:
    from trainer.tools.gpu_check import run_gpu_check as check

    return check(args["steps"], args["smoke_steps"], args["out"], args["install_te"])


GPU_CHECK_PRECISION = Command(
    script="gpu_check_precision.py", run=run_gpu_check,
    options={"steps": Option(50, "steps of each main run", check=positive),
             "smoke_steps": Option(10, "steps of each smoke run", check=positive),
             "out": Option(None, "where the runs go (default: a new temporary folder)",
                           type=str | None),
             "install_te": Option(False, "try to install Transformer Engine first", type=bool)})


def run_nemotron_table(args: Arguments) -> int:
    """docs/nemotron.md from the recipes' source tables: printed, or written to `out`."""
    from recipes.nemotron.page import nemotron_page

    out = args["out"]
    if out is not None:  # the path's mistakes before the page is built, one line each
        path = Path(out).expanduser()
        if path.is_dir():
            raise ConfigError(f"out={out} is a directory; give a file path such as "
                              f"out={path / 'nemotron.md'} (docs/nemotron.md is the page)")
        if not path.parent.is_dir():
            what = "is a file, not a folder" if path.parent.exists() else "does not exist"
            raise ConfigError(f"out={out}: its folder {path.parent} {what}; create it "
                              "first or give a path in an existing folder, e.g. "
                              "out=docs/nemotron.md")
    page = nemotron_page()
    if out is None:
        print(page, end="")
        return 0
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as err:  # no permission, a full disk: one line, not a traceback
        raise ConfigError(f"out={out} cannot be written ({err.strerror}); give a writable "
                          "file path, e.g. out=docs/nemotron.md") from None
    print(f"wrote {args['out']}")
    return 0


NEMOTRON_TABLE = Command(
    script="nemotron_table.py", run=run_nemotron_table,
    options={"out": Option(None, "write the page here (e.g. docs/nemotron.md); null: print it",
                           type=str | None)})


COMMANDS = (PRETRAIN, BENCH_STEP, VALIDATE_RESUME, CHECK_MEGATRON_PARITY, BENCH_CHECKPOINT, PLAN,
            LAUNCH, SCALING, CONVERT, COMPARE_RUNS, PREPARE_DATA, BENCH_DATA, BENCH_DOCUMENTS,
            BENCH_PACKING, BENCH_SEARCH, GPU_CHECK_PRECISION, NEMOTRON_TABLE)
