"""What only a GPU can check, each through `scripts/pretrain.py` as a user would run it
(`scripts/gpu_check_precision.py` is the usage): BF16 against FP8 current scaling, concatenated
and packed THD rows through Transformer Engine, a smoke run of every other preset (the ones a
plugin names `_hybrid`, NVIDIA's Nemotron FP8 presets, on a Nemotron-H-shaped hybrid; `_super`
on a Nemotron 3 Super-shaped one, whose BF16 run is the check's own: latent MoE and MTP on TE's
layers; NVFP4 trains on Blackwell only and is refused elsewhere in one line); per run the
model TFLOP/s and MFU against the cluster file's peak, the peak allocated memory against the
plan's (goal within 10%), and the GPU fusions the run's layers have on. Without Transformer
Engine it still runs what the local layers can (BF16: speed, MFU, memory against the plan) and
says in one line why the rest cannot run (exit code 2), as it does without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from plugins.protocol.metrics_file import METRICS_FILE
from plugins.registry import PluginsConfig
from recipes.config.machine import detect_machine

REPO = Path(__file__).resolve().parents[2]
EXIT_CANNOT_RUN = 2
LOSS_TOLERANCE = 0.05  # FP8 may differ from BF16 by 5% of the loss (mean of the last 10 steps)
MEMORY_TOLERANCE = 0.10  # peak allocated memory within 10% of the plan's worst rank
CLUSTER = "conf/cluster/h200_1x8.yaml"  # the peak MFU is measured against
# Fusions every run on TE's layers must have on (gradient accumulation fusion needs APEX).
EXPECTED_FUSIONS = ("bias_activation_fusion", "bias_dropout_fusion", "apply_rope_fusion",
                    "masked_softmax_fusion", "persist_layer_norm", "cross_entropy_loss_fusion")
WARMUP_STEPS = 5  # first steps (TE kernel selection, allocator) left out of tokens/s
MODEL = [
    "model.num_layers=8", "model.hidden_size=1024",
    "model.ffn_hidden_size=4096", "model.num_attention_heads=16", "model.seq_length=1024",
    "model.vocab_size=2048", "data.source=blend", "data.blend=conf/data/python_stdlib.yaml",
    "precision.dtype=bf16", "train.global_batch_size=16", "scheduler.warmup_iters=5",
    "optimizer.lr=3e-4", "optimizer.min_lr=3e-5", "train.eval_interval=0", "train.eval_iters=0",
    "checkpoint.save=false", "logging.progress_bar=false", "logging.log_interval=10",
    f"cluster.spec={CLUSTER}",
]
# What a plugin's `_hybrid` GPU checks train on instead: the same sizes as a Nemotron-H-shaped
# hybrid (Mamba2, MLP and one attention layer; squared ReLU, RMSNorm, no position embedding, no
# biases, untied), so FP8's BF16 end layers are Mamba and MLP layers as in NVIDIA's runs.
HYBRID = ["model.hybrid_layer_pattern=M-M*M-M-", "model.position_embedding=none",
          "model.activation=squared_relu", "model.normalization=RMSNorm",
          "model.add_bias_linear=false", "model.share_embeddings_and_output_weights=false"]
# A Nemotron 3 Super-shaped hybrid (`_super` runs): NVIDIA's tiny Super pattern with two MTP
# depths sharing one attention + MoE layer, 8 experts routed the Nemotron 3 way in a latent
# width of 256 (recipes/nemotron/nemotron3_super.py at the check's sizes).
SUPER = [*HYBRID, "model.num_layers=7", "model.hybrid_layer_pattern=MEM*EME/*E/*E",
         "model.num_moe_experts=8", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=1024",
         "model.moe_shared_expert_ffn_hidden_size=2048", "model.moe_latent_size=256",
         "model.moe_router_score_function=sigmoid", "model.moe_router_expert_bias=true",
         "model.moe_grouped_gemm=true", "model.mtp_use_repeated_layer=true",
         "model.mtp_loss_scaling_factor=0.3"]
LOCAL = ["model.transformer_impl=local"]
CONCATENATED = ["train.micro_batch_size=4"]
PACKED = ["data.documents=packed", "train.micro_batch_size=1"]
TP2_SP = ["parallel.tensor=2", "parallel.sequence_parallel=true", "cluster.gpus_per_node=2"]
# The plugins' own GPU check runs (the FP8 recipes); current scaling is also compared with BF16.
PLUGIN_CHECKS = PluginsConfig().gpu_checks()
FP8_CURRENT = PLUGIN_CHECKS.pop("fp8_current")
SMOKE = {**PLUGIN_CHECKS, "fp16": ["precision.dtype=fp16", "precision.initial_loss_scale=4096"],
         "bf16_super": []}
NEEDS_TWO_GPUS = (
    "FP8 on TP2 + sequence parallel (amax reduction over the TP group, FP8 GEMMs on sequence-"
    "sharded activations)",
    "FP8 with PP2 and bf16 end layers on different pipeline stages",
    "FP8 with the distributed optimizer over DP2 (amax/scale state sharded with the optimizer)",
)


@dataclass
class RunResult:
    name: str
    returncode: int
    losses: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    skipped: int = 0
    message: str = ""  # the refusal line (exit 2) or the tail of a failure
    tflops: list[float] = field(default_factory=list)  # model TFLOP/s per GPU, measured steps
    mfu: list[float] = field(default_factory=list)
    memory_gib: float | None = None  # the run's peak allocated memory (busiest rank)
    planned_gib: float | None = None  # the plan's worst rank for the same config
    fusions: str = ""  # the run's "layers: ..." line (TE layers only)

    @property
    def refused(self) -> bool:
        return self.returncode == EXIT_CANNOT_RUN

    def tail_mean(self, count: int = 10) -> float:
        return statistics.fmean(self.losses[-count:])

    def median_tokens_per_s(self) -> float:
        rates = self.tokens_per_s[WARMUP_STEPS:] or self.tokens_per_s
        return statistics.median(rates) if rates else 0.0

    def memory_ratio(self) -> float | None:
        if not self.memory_gib or not self.planned_gib:
            return None
        return self.memory_gib / self.planned_gib


# ---- can this machine run the check at all? (one line each) ---------------------------------


def gpu_problem() -> str | None:
    machine = detect_machine()
    if machine.gpus > 0:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = f" (CUDA_VISIBLE_DEVICES='{visible}' hides them)" if visible is not None else ""
    return (f"no NVIDIA GPU visible here: no /dev/nvidiaN device and no driver listing"
            f"{hidden}; run scripts/gpu_check_precision.py on a GPU node")


def torch_cuda_problem() -> str | None:
    import torch

    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU-only build; install a CUDA build of torch "
                "(bash scripts/setup_env.sh on the GPU node)")
    try:
        torch.cuda.init()
        reason = "torch.cuda.is_available() is False"
    except Exception as error:  # the driver's own words: too old, not loaded, ...
        reason = " ".join(str(error).split())
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use the GPUs: {reason}"


def why_pip_failed(output: str) -> str:
    """The reason a `pip install transformer_engine[pytorch]` failed, in one line."""
    text = output.lower()
    known = (
        (("temporary failure in name resolution", "failed to establish a new connection",
          "network is unreachable", "connection refused"),
         "the package index cannot be reached from this machine (no network)"),
        (("no matching distribution", "could not find a version"),
         "no Transformer Engine build on the package index fits this Python/CUDA/platform"),
        (("nvcc", "cuda_home"), "building from source needs the CUDA toolkit (nvcc), not found"),
        (("cudnn.h", "cudnn"), "building from source needs the cuDNN headers, not found"),
    )
    for needles, reason in known:
        if any(needle in text for needle in needles):
            return reason
    errors = [line.strip() for line in output.splitlines() if "error" in line.lower()]
    return errors[-1] if errors else "pip failed without an error line"


def install_transformer_engine() -> str | None:
    """Try to install TE; None on success, else why not (one line)."""
    command = [sys.executable, "-m", "pip", "install", "--no-build-isolation",
               "transformer_engine[pytorch]"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        return "pip install transformer_engine[pytorch] ran over an hour (a source build?)"
    return None if result.returncode == 0 else why_pip_failed(result.stdout + result.stderr)


def transformer_engine_problem(install: bool) -> str | None:
    import importlib.util

    import torch

    if importlib.util.find_spec("transformer_engine") is None:
        why = install_transformer_engine() if install else (
            "not installed; install it with pip install --no-build-isolation "
            "'transformer_engine[pytorch]' (or rerun with install_te=true to see why it cannot be)")
        if why is not None:
            return f"Transformer Engine is needed for FP8 and packed THD attention: {why}"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as error:  # an ABI mismatch shows up here, not at install time
        first = " ".join(str(error).split())[:300]
        return (f"Transformer Engine is installed but does not import ({first}); it must be "
                f"built for this torch {torch.__version__} with CUDA {torch.version.cuda}")
    return None


def cannot_run(install_te: bool) -> str | None:
    for problem in (gpu_problem, torch_cuda_problem):
        if message := problem():
            return message
    return transformer_engine_problem(install_te)


# ---- the runs ---------------------------------------------------------------------------------


def _train_records(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"]


def read_metrics(run_dir: Path) -> tuple[list[float], list[float], int]:
    train = _train_records(run_dir)
    return ([r["loss"] for r in train], [r["tokens_per_s"] for r in train],
            sum(1 for r in train if r.get("skipped")))


def speed_and_memory(run_dir: Path) -> dict:
    """Model TFLOP/s and MFU of the measured steps, and the run's peak allocated memory."""
    train = _train_records(run_dir)
    measured = [r for r in train if r.get("measured", True)][WARMUP_STEPS:] or train
    memory = [r["memory_gib"] for r in train if r.get("memory_gib") is not None]
    return {"tflops": [r["model_tflops_per_gpu"] for r in measured],
            "mfu": [r["mfu"] for r in measured if r.get("mfu") is not None],
            "memory_gib": max(memory) if memory else None}


def planned_peak_gib(overrides: list[str]) -> float:
    """The planner's worst-rank peak for the run's own config on the check's cluster file."""
    from recipes.plan.build import PlanOptions, make_plan
    from recipes.plan.cluster import load_cluster
    from recipes.resolve import resolve_config

    cfg = resolve_config([*run_arguments(overrides), "train.train_iters=50"])
    attention = "explicit" if "model.transformer_impl=local" in overrides else "flash"
    plan = make_plan(cfg, load_cluster(REPO / CLUSTER), PlanOptions(attention=attention))
    return plan.worst.peak / 2**30


def run_arguments(overrides: list[str]) -> list[str]:
    """pretrain.py's arguments for one run: the check's model and data, then the run's own."""
    return ["recipe=tiny_dp1", *MODEL, *overrides]


def shape_of(name: str) -> list[str]:
    """The model a smoke run trains, by its name's ending: a hybrid's, a Super-shaped one's, or
    the check's GPT (none)."""
    return HYBRID if name.endswith("_hybrid") else SUPER if name.endswith("_super") else []


def planned_runs() -> dict[str, list[str]]:
    """Every run this script may start, by name (for tests: each must be a valid config)."""
    return {
        "bf16": CONCATENATED, "fp8_current": [*CONCATENATED, *FP8_CURRENT],
        "bf16_thd": PACKED, "fp8_current_thd": [*PACKED, *FP8_CURRENT],
        **{name: [*CONCATENATED, *shape_of(name), *overrides] for name, overrides in SMOKE.items()},
        "fp8_current_tp2_sp": [*CONCATENATED, *FP8_CURRENT, *TP2_SP],
        "bf16_local": [*CONCATENATED, *LOCAL],
    }


def train(name: str, overrides: list[str], steps: int, out: Path) -> RunResult:
    """One pretrain.py run; its losses and tokens/s, or its refusal or failure."""
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, str(REPO / "scripts" / "pretrain.py"), *run_arguments(overrides),
               f"train.train_iters={steps}", f"run_dir={run_dir}"]
    print(f"  {name}: {' '.join(overrides) or '(bf16 only)'}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        message = lines[-1] if lines else result.stderr.strip()[-1500:]
        return RunResult(name, result.returncode, message=message)
    losses, rates, skipped = read_metrics(run_dir)
    figures = speed_and_memory(run_dir)
    fusions = next((line for line in result.stdout.splitlines()
                    if line.startswith("layers: Transformer Engine's")), "")
    return RunResult(name, 0, losses, rates, skipped, tflops=figures["tflops"],
                     mfu=figures["mfu"], memory_gib=figures["memory_gib"],
                     planned_gib=planned_peak_gib(overrides), fusions=fusions)


def describe(run: RunResult) -> str:
    if run.refused:
        return f"{run.name:<24} refused before launch: {run.message}"
    if run.returncode != 0:
        return f"{run.name:<24} FAILED (exit {run.returncode}): {run.message}"
    skipped = f", {run.skipped} skipped updates" if run.skipped else ""
    speed = ""
    if run.tflops:
        mfu = f", MFU {statistics.median(run.mfu):.1%}" if run.mfu else ""
        speed = f", {statistics.median(run.tflops):.1f} model TFLOP/s per GPU{mfu}"
    ratio = run.memory_ratio()
    memory = (f", peak {run.memory_gib:.2f} GiB vs plan {run.planned_gib:.2f} GiB "
              f"(x{ratio:.2f})" if ratio else "")
    return (f"{run.name:<24} {len(run.losses)} steps, final loss {run.losses[-1]:.4f}, last-10 "
            f"mean {run.tail_mean():.4f}, {run.median_tokens_per_s():,.0f} tokens/s"
            f"{speed}{memory}{skipped}")


def memory_check(run: RunResult) -> tuple[str, bool]:
    """Whether the run's peak allocated memory is within MEMORY_TOLERANCE of the plan's."""
    ratio = run.memory_ratio()
    if ratio is None:
        return f"{run.name}: memory not compared (no peak or no plan)", False
    ok = abs(ratio - 1) <= MEMORY_TOLERANCE
    return (f"{run.name}: peak allocated {run.memory_gib:.2f} GiB is x{ratio:.2f} the plan's "
            f"{run.planned_gib:.2f} GiB (goal within {MEMORY_TOLERANCE:.0%}: "
            f"{'ok' if ok else 'OFF'})"), ok


def fusion_check(run: RunResult) -> tuple[str, bool]:
    """Whether the run's TE layers had every expected fusion on (its own `layers:` line)."""
    if not run.fusions:
        return (f"{run.name}: no 'layers: Transformer Engine's' line: the run built no TE "
                "layers"), False
    on = run.fusions.split("fusions on: ", 1)[1].split(";", 1)[0].split(", ")
    missing = [name for name in EXPECTED_FUSIONS if name not in on]
    return (f"{run.name}: {run.fusions}" + (f" (MISSING {', '.join(missing)})" if missing else ""),
            not missing)


def compare(reference: RunResult, fp8: RunResult) -> tuple[str, bool]:
    """The FP8-vs-reference line and whether FP8 stayed within LOSS_TOLERANCE."""
    if reference.returncode or fp8.returncode:
        return f"{fp8.name} vs {reference.name}: not compared (a run did not train)", False
    final = fp8.losses[-1] - reference.losses[-1]
    tail = fp8.tail_mean() - reference.tail_mean()
    relative = abs(tail) / reference.tail_mean()
    speed = fp8.median_tokens_per_s() / max(reference.median_tokens_per_s(), 1e-9)
    ok = relative <= LOSS_TOLERANCE
    return (f"{fp8.name} vs {reference.name}: final loss difference {final:+.4f}, last-10 mean "
            f"difference {tail:+.4f} ({relative:.2%}, tolerance {LOSS_TOLERANCE:.0%}: "
            f"{'ok' if ok else 'TOO LARGE'}), tokens/s x{speed:.2f}"), ok


def main_runs(steps: int, out: Path) -> tuple[list[str], bool]:
    plan = planned_runs()
    runs = {name: train(name, plan[name], steps, out)
            for name in ("bf16", "fp8_current", "bf16_thd", "fp8_current_thd")}
    lines = [describe(run) for run in runs.values()]
    ok = all(run.returncode == 0 for run in runs.values())
    for check in (memory_check(runs["bf16"]), fusion_check(runs["bf16"]),
                  fusion_check(runs["bf16_thd"])):
        lines.append(check[0])
        ok = ok and check[1]
    for reference, fp8 in (("bf16", "fp8_current"), ("bf16_thd", "fp8_current_thd")):
        line, close = compare(runs[reference], runs[fp8])
        lines.append(line)
        ok = ok and close
    if runs["bf16_thd"].returncode == 0:
        lines.append("packed THD rows trained through Transformer Engine's attention (the "
                     "local attention refuses packed sequences)")
    return lines, ok


def smoke_runs(steps: int, out: Path) -> tuple[list[str], bool]:
    """Every other preset trains briefly or is refused before launch with its one line."""
    plan = planned_runs()
    runs = [train(name, plan[name], steps, out) for name in SMOKE]
    return [describe(run) for run in runs], all(run.returncode in (0, 2) for run in runs)


def multi_gpu_runs(gpus: int, steps: int, out: Path, fp8_one_gpu: Path) -> tuple[list[str], bool]:
    if gpus < 2:
        return [f"needs 2 GPUs, not checked on this {gpus}-GPU machine: {item}"
                for item in NEEDS_TWO_GPUS], True
    if not (fp8_one_gpu / METRICS_FILE).exists():
        return ["fp8_current_tp2_sp: not run (the one-GPU FP8 run did not train)"], False
    one = RunResult("fp8_current", 0, *read_metrics(fp8_one_gpu)[:2])
    tp2 = train("fp8_current_tp2_sp", planned_runs()["fp8_current_tp2_sp"], steps, out)
    line, close = compare(one, tp2)
    return [describe(tp2), line], tp2.returncode == 0 and close


def local_layers_only(steps: int, out: Path, reason: str) -> int:
    """Without Transformer Engine: what the local layers can show (BF16 speed, MFU, memory
    against the plan), then the one line saying why FP8 and THD cannot run (exit 2)."""
    print(f"GPU check with Megatron Core's local layers only ({reason})", flush=True)
    run = train("bf16_local", planned_runs()["bf16_local"], steps, out)
    line, ok = memory_check(run) if run.returncode == 0 else ("bf16_local did not train", False)
    print("\n".join([describe(run), line]))
    print(f"error: {reason}", file=sys.stderr)
    return EXIT_CANNOT_RUN if ok else 1


def run_gpu_check(steps: int, smoke: int, out_dir: str | None, install_te: bool) -> int:
    """The whole check; exit 0 when everything this machine can check passed, 1 when a run
    failed or FP8 drifted, 2 (one line) when the machine cannot run it at all."""
    for problem in (gpu_problem, torch_cuda_problem):
        if message := problem():
            print(f"error: {message}", file=sys.stderr)
            return EXIT_CANNOT_RUN
    out = Path(out_dir or tempfile.mkdtemp(prefix="gpu_check_precision-"))
    if reason := transformer_engine_problem(install_te):
        return local_layers_only(steps, out, reason)
    machine = detect_machine()
    print(f"precision GPU check: {machine.gpus} GPU(s), compute capability "
          f"{machine.compute_capability}, Transformer Engine {machine.transformer_engine}; "
          f"runs in {out}", flush=True)
    report, ok = main_runs(steps, out)
    for lines, passed in (smoke_runs(smoke, out),
                          multi_gpu_runs(machine.gpus, steps, out, out / "fp8_current")):
        report += lines
        ok = ok and passed
    print("\n".join(report))
    print("result: " + ("every check this machine can run passed" if ok else "FAILED"))
    return 0 if ok else 1

