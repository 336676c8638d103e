"""Train the same steps with this trainer and with Megatron-LM's own loop, and compare.

`scripts/check_megatron_parity.py` runs this on every rank. First this trainer: `steps` steps of
the recipe, recording per step the loss, grad norm and learning rate, the micro-batches each
rank trained on, and the weights before the first step and after the last. Then Megatron-LM:
`megatron.training.pretrain` from the wheel, driven as its `pretrain_gpt.py` (a hybrid model:
`pretrain_hybrid.py`) drives it (`parse_and_validate_args` over the recipe's Megatron-LM
command line, `recipes/config/megatron_args.py`, then `gpt_config_from_args` or
`hybrid_config_from_args`, `pretrain_cfg_container_from_args`, `pretrain`), with three things
of ours plugged into the places Megatron-LM leaves to the caller:
- the initial weights: a `pre_wrap_hooks` entry of the model config
  (`megatron/training/models/base.py:72`) copies ours into the model before DDP and the
  optimizer see it;
- the batches: the dataset provider returns, at every sample index Megatron-LM's sampler gives
  this rank, the sample this rank trained on at that position, so each DP rank gets the same
  micro-batches in the same order;
- `forward_step`, `loss_func` and `get_batch`: those of `pretrain_gpt.py` (core_v0.19.0), which
  the wheel does not ship, without its SFT, packed-sequence and ModelOpt branches
  (`pretrain_hybrid.py`'s are the same for plain batches).

A hybrid's stack spec is this project's (`trainer/models/hybrid/spec.py`): on CPU Megatron-LM's
own is Transformer Engine's, and Megatron-LM has no flag for the Mamba mixer's conv width and
chunk size, which the spec passes as the mixer's params, so both runs build the same mixer.

Settings where the two differ on purpose are listed in `ALIGNMENTS`: the check adds the flag
that aligns each one and prints the list. On CPU the CPU runtime runs Megatron-LM as it runs
this trainer, with the patches of `megatron.training` that `megatron_lm_on_cpu` applies
(`trainer/cpu_runtime/megatron_lm.py`: the device's architecture, `initialize_megatron` without
CUDA seeing one device, the compiled dataset helpers, and for a `--load` the distributed
optimizer's load-path fixes). `train_megatron_lm` takes more Megatron-LM flags (`--save`,
`--load`), which is how tests/dist/test_megatron_lm_checkpoints.py moves runs between the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from recipes.config.megatron_args import script_name, to_megatron_args
from recipes.config.schema import RunConfig
from trainer.cpu_runtime.megatron_lm import megatron_lm_on_cpu
from trainer.tools.parity_scope import unsupported


@dataclass(frozen=True)
class Alignment:
    setting: str
    ours: str
    megatron_lm: str  # Megatron-LM's default for the recipe's command line
    flags: tuple[str, ...]  # what the check adds to Megatron-LM's command line
    why: str


ALIGNMENTS: tuple[Alignment, ...] = (
    Alignment("per-token loss", "always (every loss token of the global batch weighs alike)",
              "off: each micro-batch's mean, averaged", (),
              "print=megatron_args writes --calculate-per-token-loss on every command line"),
    Alignment("WSD decay iterations", "a tenth of the decay iterations when unset",
              "none: Megatron-LM's WSD scheduler needs --lr-wsd-decay-iters", (),
              "print=megatron_args writes the resolved value (wsd recipes only)"),
    Alignment("weight-decay steps", "the lr decay span", "train_iters x global batch", (),
              "no effect: the project's weight decay is constant (start = end)"),
    Alignment("EOD loss mask", "on", "off", (),
              "the recipe's command line carries --eod-mask-loss; the batches (and their "
              "loss masks) are the trainer's in both runs"),
)


def cpu_flags() -> list[str]:
    """On CPU ranks this trainer builds Megatron Core's local layers with no GPU fusions; the
    recipe's command line (`transformer_impl=auto`) asks Megatron-LM for Transformer Engine's,
    with fusions on, which need CUDA (`transformer_config.py:2185`, RoPE fusion)."""
    return ["--transformer-impl", "local", "--no-rope-fusion", "--no-bias-dropout-fusion",
            "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-masked-softmax-fusion",
            "--no-gradient-accumulation-fusion", "--no-persist-layer-norm",
            "--use-cpu-initialization"]


def run_flags(steps: int) -> list[str]:
    """How the check runs Megatron-LM's loop: the recipe's schedule (`--train-iters`), left
    after `steps` steps (`--exit-interval`, which ends in sys.exit), no evaluation, no saving, no
    data-loader workers, the attention mask built by the model as in this trainer."""
    return ["--exit-interval", str(steps), "--eval-iters", "0", "--eval-interval", str(steps + 1),
            "--log-interval", "1", "--num-workers", "0", "--save-interval", str(steps + 1),
            "--no-create-attention-mask-in-dataloader", "--distributed-backend",
            "gloo" if not torch.cuda.is_available() else "nccl"]


def parity_arguments(cfg: RunConfig, steps: int) -> list[str]:
    """Megatron-LM's command line for the check: the recipe's (print=megatron_args; on CPU as
    its local layers train it), the alignments, the CPU layers on CPU, and the run's own flags
    (later flags win)."""
    on_cpu = not torch.cuda.is_available()
    args = to_megatron_args(local_layers(cfg) if on_cpu else cfg)
    for alignment in ALIGNMENTS:
        args += list(alignment.flags)
    if on_cpu:
        args += cpu_flags()
    return args + run_flags(steps)


def local_layers(cfg: RunConfig) -> RunConfig:
    """The recipe as Megatron Core's local layers train it: Transformer Engine's MoE kernels
    and the flex dispatcher off, as the one translation leaves them without TE
    (`trainer/mcore_translation.py`, `fast_path_fields`); Megatron-LM's flags for them have no
    negative (`--moe-grouped-gemm` asks the GPU's compute capability, `arguments.py:1338-1340`)."""
    m = cfg.model
    model = dataclasses.replace(
        m, moe_grouped_gemm=False, moe_permute_fusion=False, moe_router_fusion=False,
        moe_shared_expert_overlap=False, moe_fused_squared_relu=False,
        moe_token_dispatcher="alltoall" if m.moe_token_dispatcher == "flex" else
        m.moe_token_dispatcher)
    return dataclasses.replace(cfg, model=model)


# --- one run's record ---------------------------------------------------------------------

@dataclass
class RunRecord:
    losses: list[float] = field(default_factory=list)  # NaN where this rank holds no loss
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    initial: list[dict[str, torch.Tensor]] = field(default_factory=list)  # per chunk
    final: list[dict[str, torch.Tensor]] = field(default_factory=list)


def weights(model: list) -> list[dict[str, torch.Tensor]]:
    from megatron.core.utils import unwrap_model

    return [{name: p.detach().clone() for name, p in chunk.named_parameters()}
            for chunk in unwrap_model(model)]


def record_steps(session, steps: int,
                 after_step: Callable[[Any], None] | None = None) -> tuple[RunRecord, list]:
    """A started session's steps up to `steps`: its record and, per step, this rank's
    micro-batches (what Megatron-LM's loop is then fed). `after_step(session)` runs after each
    step (a test saves a checkpoint there)."""
    from trainer.step import train_step

    record, batches = RunRecord(initial=weights(session.model)), []
    while session.state.step < steps:
        batches.append([{k: v.clone() for k, v in mb.items() if torch.is_tensor(v)}
                        for mb in session.train_batches.upcoming()])
        metrics = train_step(session)
        record.losses.append(metrics.loss)
        record.grad_norms.append(metrics.grad_norm)
        record.lrs.append(metrics.lr)
        if after_step is not None:
            after_step(session)
    record.final = weights(session.model)
    return record, batches


def train_ours(cfg: RunConfig, run_dir: Path, steps: int) -> tuple[RunRecord, list]:
    """This trainer's run: its record and, per step, this rank's micro-batches."""
    from megatron.core import parallel_state

    from trainer.session import start_session

    record, batches = record_steps(start_session(cfg, run_dir), steps)
    parallel_state.destroy_model_parallel()
    return record, batches


# --- Megatron-LM's run ----------------------------------------------------------------------

class RecordedSamples(torch.utils.data.Dataset):
    """Sample index -> the sample this rank trained on there. Megatron-LM's sampler hands DP
    rank r, for micro-batch m of global batch k, indices kG + m*b*D + r*b + i
    (`megatron/training/datasets/data_samplers.py`, MegatronPretrainingSampler); this trainer's
    rank r trained on its recorded micro-batch m at that place."""

    def __init__(self, batches: list, global_batch: int, micro_batch: int, dp: int, dp_rank: int):
        self.batches, self.g, self.b, self.dp, self.rank = (batches, global_batch, micro_batch,
                                                            dp, dp_rank)

    def __len__(self) -> int:
        return len(self.batches) * self.g

    def __getitem__(self, index: int) -> dict:
        step, offset = divmod(int(index), self.g)
        micro, rest = divmod(offset, self.b * self.dp)
        rank, row = divmod(rest, self.b)
        if rank != self.rank:
            raise IndexError(f"sample {index} belongs to DP rank {rank}, not {self.rank}")
        mb = self.batches[step][micro]
        return {key: mb[key][row] for key in ("tokens", "labels", "loss_mask", "position_ids")}


def _get_batch(data_iterator, vp_stage=None):
    """pretrain_gpt.py's get_batch (core_v0.19.0) for plain GPT batches."""
    from megatron.core import mpu
    from megatron.core.utils import get_batch_on_this_cp_rank, get_batch_on_this_tp_rank
    from megatron.training import get_args
    from megatron.training.utils import is_first_or_last_pipeline_stage

    args = get_args()
    if not is_first_or_last_pipeline_stage(vp_stage):
        return None, None, None, None, None
    batch = {}
    if mpu.get_tensor_model_parallel_rank() == 0:
        batch = {k: v.cuda(non_blocking=True) for k, v in next(data_iterator).items()}
        batch["attention_mask"] = None
    # Positional, in the signature's order (`core/utils.py:2119`): batch, has_cu_seqlens,
    # is_hybrid_cp, create_attention_mask_in_dataloader, broadcast src rank and group, cp size,
    # tp rank, micro-batch, sequence, mtp_on_this_rank, pipeline size, first / last stage.
    batch = get_batch_on_this_tp_rank(
        batch, False, False, False, mpu.get_tensor_model_parallel_src_rank(),
        mpu.get_tensor_model_parallel_group(), args.context_parallel_size,
        mpu.get_tensor_model_parallel_rank(), args.micro_batch_size, args.seq_length, False,
        args.pipeline_model_parallel_size, mpu.is_pipeline_first_stage(),
        mpu.is_pipeline_last_stage())
    batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False,
                                      cp_group=mpu.get_context_parallel_group())
    return (batch["tokens"], batch["labels"], batch["loss_mask"], batch.get("attention_mask"),
            batch["position_ids"])


def _loss_func(loss_mask, output_tensor):
    """pretrain_gpt.py's loss_func: summed loss, token count, [sum, count] report."""
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1),
                                                     num_tokens.view(1)])}


def _forward_step(data_iterator, model):
    """pretrain_gpt.py's forward_step for plain GPT batches."""
    from megatron.core.utils import get_attr_wrapped_model

    vp_stage = get_attr_wrapped_model(model, "vp_stage")
    tokens, labels, loss_mask, attention_mask, position_ids = _get_batch(data_iterator, vp_stage)
    output = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output, partial(_loss_func, loss_mask)


def _copy_weights(source: list[dict[str, torch.Tensor]], record: RunRecord):
    """The pre-wrap hook: Megatron-LM's own initial weights kept for the report, then ours."""
    def hook(model_list):
        mine = weights(model_list)
        record.initial = mine
        for chunk, params in zip(model_list, source, strict=True):
            named = dict(chunk.named_parameters())
            if set(named) != set(params):
                missing = sorted(set(named) ^ set(params))[:3]
                raise RuntimeError(f"Megatron-LM's model has other parameters than this "
                                   f"trainer's: {missing}")
            with torch.no_grad():
                for name, tensor in params.items():
                    named[name].copy_(tensor)
        return model_list
    return hook


def _cpu_plugins(cfg: RunConfig):
    from plugins.registry import build_plugins
    from trainer.cpu_runtime.runtime import runtime_for

    plugins = build_plugins(cfg)
    plugins.setup_runtime(runtime_for(cfg.cluster))
    return plugins


def _cpu_layer_spec(cfg: RunConfig):
    """Megatron-LM's default layer spec with the CPU runtime's and the plugins' adaptations, as
    this trainer applies them (`trainer.model.adapted_spec`): SP-capable norms, the packed
    attention."""
    from megatron.training.models.gpt import default_layer_spec

    from trainer.model import adapted_spec

    plugins = _cpu_plugins(cfg)

    def spec(model_config, vp_stage=None):
        return adapted_spec(default_layer_spec(model_config, vp_stage),
                            model_config.transformer, plugins)
    return spec


def _hybrid_stack_spec(cfg: RunConfig, transformer):
    """This project's hybrid stack spec, adapted as this trainer adapts it: on CPU its local
    layers (Megatron-LM's default is Transformer Engine's), on GPUs Megatron's own spec; both
    with the recipe's mixer conv width and chunk size, which Megatron-LM has no flag for."""
    from trainer.model import adapted_spec, transformer_engine_in_use
    from trainer.models.hybrid.spec import hybrid_stack_spec

    spec = hybrid_stack_spec(cfg, transformer_engine=transformer_engine_in_use(cfg))
    return adapted_spec(spec, transformer, _cpu_plugins(cfg))


def _model_config(cfg: RunConfig, args):
    """Megatron-LM's model config as its entry script makes it, with the spec this check
    gives it (a GPT's adapted to CPU ranks; a hybrid's always this project's)."""
    from megatron.training.argument_utils import gpt_config_from_args, hybrid_config_from_args

    if cfg.model.is_hybrid:
        model_cfg = hybrid_config_from_args(args)
        model_cfg.hybrid_stack_spec = _hybrid_stack_spec(cfg, model_cfg.transformer)
        return model_cfg
    model_cfg = gpt_config_from_args(args)
    if not torch.cuda.is_available():
        model_cfg.transformer_layer_spec = _cpu_layer_spec(cfg)
    return model_cfg


@contextlib.contextmanager
def _recording_steps(record: RunRecord):
    """Wraps Megatron-LM's train_step to keep each step's loss, grad norm and lr."""
    import megatron.training.training as training

    original = training.train_step

    def train_step(*args, **kwargs):
        result = original(*args, **kwargs)
        loss_dict, grad_norm, optimizer = result[0], result[5], args[3]
        loss = loss_dict.get("lm loss")
        record.losses.append(float(loss) if loss is not None else math.nan)
        record.grad_norms.append(float(grad_norm) if grad_norm is not None else math.nan)
        record.lrs.append(float(optimizer.param_groups[0]["lr"]))
        return result

    training.train_step = train_step
    try:
        yield
    finally:
        training.train_step = original


def _forget_megatron_lm() -> None:
    """What Megatron-LM's loop leaves set in this process, cleared for a later run in it."""
    from megatron.core import mpu
    from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator
    from megatron.core.rerun_state_machine import destroy_rerun_state_machine
    from megatron.training.global_vars import destroy_global_vars

    mpu.destroy_model_parallel()
    destroy_global_vars()
    destroy_num_microbatches_calculator()
    destroy_rerun_state_machine()


def train_megatron_lm(cfg: RunConfig, steps: int, ours: RunRecord, batches: list,
                      extra: Sequence[str] = (), skip: frozenset[str] = frozenset()
                      ) -> RunRecord:
    """Megatron-LM's run of the same steps from our initial weights on our batches (`extra`:
    more Megatron-LM flags, e.g. `--save DIR` or `--load DIR`; a run that loads a checkpoint
    starts at its step and records the steps after it; `skip`: patches of
    `megatron_lm_on_cpu` left out)."""
    from megatron.core import mpu
    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    record, models = RunRecord(), []
    argv, sys.argv = sys.argv, [script_name(cfg), *parity_arguments(cfg, steps), *extra]
    os.environ.setdefault("LOCAL_RANK", "0")
    try:
        with megatron_lm_on_cpu(skip):
            args = parse_and_validate_args()
    finally:
        sys.argv = argv
    model_cfg = _model_config(cfg, args)
    model_cfg.pre_wrap_hooks.append(_copy_weights(ours.initial, record))
    model_cfg.post_wrap_hooks.append(lambda model: models.extend(model) or model)
    container = pretrain_cfg_container_from_args(args, model_cfg)

    def datasets(num_samples, vp_stage=None):
        t = cfg.train
        dp, rank = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
        return RecordedSamples(batches, t.global_batch_size, t.micro_batch_size, dp,
                               rank), None, None

    datasets.is_distributed = True
    try:
        with megatron_lm_on_cpu(skip), _recording_steps(record):
            try:
                pretrain(container, datasets, ModelType.encoder_or_decoder, _forward_step)
            except SystemExit as stop:  # --exit-interval leaves by sys.exit (training.py:4155)
                if stop.code not in (0, None):
                    raise RuntimeError(f"Megatron-LM's loop exited with code {stop.code}"
                                       ) from None
        record.final = weights(models)
    finally:
        _forget_megatron_lm()
    return record


# --- the comparison -------------------------------------------------------------------------

def _max_over_world(values: list[float]) -> list[float]:
    t = torch.tensor([-1.0 if math.isnan(v) else v for v in values], dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return [math.nan if v < 0 else v for v in t.tolist()]


def _fp32(value: float) -> float:
    """Megatron-LM reports the loss and grad norm as fp32 tensors (`training.py:2546-2552`,
    `reduce_max_stat_across_model_parallel_group`); this trainer in fp64. Compared at fp32."""
    return float(torch.tensor(value, dtype=torch.float32))


def _diffs(ours: list[float], theirs: list[float], as_reported) -> list[float]:
    return [abs(as_reported(a) - b) for a, b in zip(ours, theirs, strict=True)]


def _weights_diff(a: list[dict], b: list[dict]) -> tuple[float, int]:
    """Largest |difference| over every parameter of this rank, and how many tensors differ."""
    worst, differ = 0.0, 0
    for chunk_a, chunk_b in zip(a, b, strict=True):
        for name, tensor in chunk_a.items():
            d = (tensor.float() - chunk_b[name].float()).abs().max().item()
            worst, differ = max(worst, d), differ + (not torch.equal(tensor, chunk_b[name]))
    return worst, differ


@dataclass
class ParityReport:
    steps: list[tuple[int, float, float, float, float, float, float]]  # step, ours/diff x3
    final_max_diff: float
    final_tensors_differ: int
    initial_max_diff: float  # Megatron-LM's own initialisation against ours (then replaced)
    arguments: list[str]
    mixer: str = ""  # a hybrid's mixer settings given through the spec ("" for GPT)

    @property
    def loss_max_diff(self) -> float:
        return max((abs(s[2]) for s in self.steps if not math.isnan(s[2])), default=0.0)

    @property
    def bit_identical(self) -> bool:
        """Final weights, every learning rate and grad norm equal bit for bit (the loss is
        compared apart: Megatron-LM divides its fp32 sum by the token count in fp32)."""
        return self.final_tensors_differ == 0 and all(
            s[4] == 0.0 and s[6] == 0.0 for s in self.steps)


def compare(ours: RunRecord, theirs: RunRecord, arguments: list[str]) -> ParityReport:
    """Per step (reduced over ranks: the loss is known on the last stage) and the weights."""
    n = len(ours.losses)
    if len(theirs.losses) != n:
        raise RuntimeError(f"Megatron-LM ran {len(theirs.losses)} steps, this trainer {n}")
    loss_ours = _max_over_world(ours.losses)
    gn_ours = _max_over_world(ours.grad_norms)
    lr_ours = _max_over_world(ours.lrs)
    loss_d = _max_over_world(_diffs(ours.losses, theirs.losses, _fp32))
    gn_d = _max_over_world(_diffs(ours.grad_norms, theirs.grad_norms, _fp32))
    lr_d = _max_over_world(_diffs(ours.lrs, theirs.lrs, float))
    final, differ = _weights_diff(ours.final, theirs.final)
    initial, _ = _weights_diff(ours.initial, theirs.initial)
    final, initial = _max_over_world([final, initial])
    differ_t = torch.tensor([differ], dtype=torch.int64)
    torch.distributed.all_reduce(differ_t)
    rows = [(i + 1, loss_ours[i], loss_d[i], gn_ours[i], gn_d[i], lr_ours[i], lr_d[i])
            for i in range(n)]
    return ParityReport(rows, final, int(differ_t.item()), initial, arguments)


def run_parity_check(cfg: RunConfig, run_dir: Path, steps: int) -> ParityReport:
    from plugins.protocol.errors import ConfigError

    problem = unsupported(cfg)
    if problem:
        raise ConfigError(problem)
    cfg = dataclasses.replace(
        cfg, checkpoint=dataclasses.replace(cfg.checkpoint, save=False, load=None, resume=False))
    ours, batches = train_ours(cfg, run_dir, steps)
    theirs = train_megatron_lm(cfg, steps, ours, batches)
    report = compare(ours, theirs, parity_arguments(cfg, steps))
    if cfg.model.is_hybrid:
        report.mixer = (f"conv width {cfg.model.mamba_conv_kernel} and chunk size "
                        f"{cfg.model.mamba_chunk_size}")
    return report


def format_report(name: str, report: ParityReport) -> str:
    lines = [f"check_megatron_parity {name}: {len(report.steps)} steps with this trainer and "
             "with megatron.training.pretrain, same initial weights, same batches",
             "aligned for the check (the project's setting, Megatron-LM's default):"]
    for a in ALIGNMENTS:
        added = " ".join(a.flags) or "nothing added"
        lines.append(f"  {a.setting}: ours {a.ours}; Megatron-LM {a.megatron_lm}; {added} "
                     f"({a.why})")
    if not torch.cuda.is_available():
        lines.append("  layers: ours are Megatron Core's local layers on CPU; Megatron-LM gets "
                     "--transformer-impl local and its fusions off")
    if report.mixer:
        lines.append(f"  hybrid stack spec: this project's, given to Megatron-LM's "
                     f"HybridModelConfig (the Mamba mixer's {report.mixer}, which Megatron-LM "
                     "has no flag for)")
    lines.append(f"Megatron-LM arguments: {' '.join(report.arguments)}")
    lines.append(f"Megatron-LM's own initial weights vs ours (before ours are loaded): max "
                 f"|difference| {report.initial_max_diff:.3g}")
    lines.append(f"  {'step':>4}  {'loss':>10}  {'|d loss|':>9}  {'grad norm':>10}  "
                 f"{'|d gnorm|':>9}  {'lr':>10}  {'|d lr|':>9}")
    for step, loss, dl, gn, dg, lr, dlr in report.steps:
        lines.append(f"  {step:>4}  {loss:>10.6f}  {dl:>9.3g}  {gn:>10.6f}  {dg:>9.3g}  "
                     f"{lr:>10.4g}  {dlr:>9.3g}")
    lines.append(f"final weights: max |difference| {report.final_max_diff:.3g}, "
                 f"{report.final_tensors_differ} tensors differ (summed over ranks)")
    verdict = ("bit-identical (final weights, grad norms, learning rates)"
               if report.bit_identical else "NOT bit-identical")
    lines.append(f"{verdict}; losses agree within {report.loss_max_diff:.3g} (Megatron-LM "
                 "reports them in fp32)")
    return "\n".join(lines)
