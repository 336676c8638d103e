"""Checks a `RunConfig` before any heavy import or process group exists.

One pure function per rule; each returns None when the rule holds, or the one sentence that
names the fields, their values and the fix. `validate` runs the core `RULES` (sizes first, so
later rules can divide safely), then each plugin's rules, and raises `ConfigError` with the
first message. Plugins keep their rules beside their code in the same form.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from plugins.protocol.errors import ConfigError, config_error
from recipes.config import fast_paths
from recipes.config.layout import Layout
from recipes.config.overrides import class_field_types
from recipes.config.phases import PHASE_RULES, check_each_phase
from recipes.config.rampup import RAMPUP_RULES
from recipes.config.schema import RunConfig
from recipes.config.sharding_rules import SHARDING_RULES
from recipes.models.gpt import rules as gpt_rules
from recipes.models.hybrid import pattern as hybrid
from recipes.models.hybrid import rules as hybrid_rules
from recipes.models.moe import rules as moe_rules

BYTE_VOCAB = 256  # the byte tokenizer emits ids 0..255


def _layout(cfg: RunConfig) -> Layout:
    return Layout.from_config(cfg)


@functools.cache
def _fields(section_type: type) -> tuple[tuple[str, Any, bool, bool], ...]:
    """(name, schema default, nullable, is a section) of a section's fields, worked out once
    per class (the layout search validates thousands of configs)."""
    hints = class_field_types(section_type)
    found = []
    for f in dataclasses.fields(section_type):
        tp = hints[f.name]
        union = isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union
        nullable = union and type(None) in typing.get_args(tp)
        found.append((f.name, f.default, nullable,
                      isinstance(tp, type) and dataclasses.is_dataclass(tp)))
    return tuple(found)


def _leaves(section: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any, bool]]:
    """(dotted key, value, schema default, nullable) of every value field, plugins included."""
    for name, default, nullable, is_section in _fields(type(section)):
        value = getattr(section, name)
        if is_section:
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value, default, nullable


def check_finite_numbers(cfg: RunConfig) -> str | None:
    """nan/inf parse as floats (`optimizer.lr=nan`) but make every later rule and the loss
    meaningless, so they are refused first, for every float field of every section."""
    for key, value, default, _ in _leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            example = default if isinstance(default, float) and math.isfinite(default) else 1.0
            return (
                f"{key}={value} must be a finite number (not nan or inf); "
                f"set it, e.g. {key}={example}"
            )


def check_empty_strings(cfg: RunConfig) -> str | None:
    """An empty text (`checkpoint.load=''`, `output_dir: ""` in a file) names nothing; the
    trainer would read it as the current directory."""
    for key, value, default, nullable in _leaves(cfg):
        if not isinstance(value, str) or value.strip():
            continue
        if nullable:
            return f"{key}='{value}' is empty; give it a value, or {key}=null to leave it unset"
        return f"{key}='{value}' is empty; give it a value, e.g. {key}={default}"


def check_name_is_a_name(cfg: RunConfig) -> str | None:
    """`name` names the run's directory `<output_dir>/<name>-<time>`: a '/' or a '..' in it
    would put the run in another folder, out of `output_dir` (`name=../../x`)."""
    name = cfg.name
    if "/" not in name and "\\" not in name and name not in (".", ".."):
        return None
    plain = "_".join(part for part in name.replace("\\", "/").split("/")
                     if part not in ("", ".", "..")) or "my_run"
    return (f"name={name} is not a plain name (runs go to {cfg.output_dir}/<name>-<time>); "
            f"give one without '/' or '..', e.g. name={plain}, or set run_dir= to choose the "
            "directory")


def check_positive_sizes(cfg: RunConfig) -> str | None:
    """Sizes and counts that must be >= 1 (None means 'not set' where the schema allows it)."""
    m, p, c, t = cfg.model, cfg.parallel, cfg.cluster, cfg.train
    sizes = {
        "model.num_layers": m.num_layers,
        "model.hidden_size": m.hidden_size,
        "model.ffn_hidden_size": m.ffn_hidden_size,
        "model.num_attention_heads": m.num_attention_heads,
        "model.num_query_groups": m.num_query_groups,
        "model.kv_channels": m.kv_channels,
        "model.seq_length": m.seq_length,
        "model.vocab_size": m.vocab_size,
        "model.rotary_base": m.rotary_base,
        "model.num_moe_experts": m.num_moe_experts,
        "model.moe_router_topk": m.moe_router_topk,
        "model.moe_ffn_hidden_size": m.moe_ffn_hidden_size,
        "model.moe_shared_expert_ffn_hidden_size": m.moe_shared_expert_ffn_hidden_size,
        "model.moe_latent_size": m.moe_latent_size,
        "model.mamba_state_dim": m.mamba_state_dim,
        "model.mamba_head_dim": m.mamba_head_dim,
        "model.mamba_num_heads": m.mamba_num_heads,
        "model.mamba_num_groups": m.mamba_num_groups,
        "model.mamba_conv_kernel": m.mamba_conv_kernel,
        "model.mamba_chunk_size": m.mamba_chunk_size,
        "parallel.tensor": p.tensor,
        "parallel.pipeline": p.pipeline,
        "parallel.virtual_pipeline": p.virtual_pipeline,
        "parallel.context": p.context,
        "parallel.expert": p.expert,
        "parallel.expert_tensor": p.expert_tensor,
        "cluster.nodes": c.nodes,
        "cluster.gpus_per_node": c.gpus_per_node,
        "cluster.threads_per_rank": c.threads_per_rank,
        "train.micro_batch_size": t.micro_batch_size,
        "train.global_batch_size": t.global_batch_size,
        "train.train_iters": t.train_iters,
        "train.recompute_num_layers": t.recompute_num_layers,
        "optimizer.bucket_size": cfg.optimizer.bucket_size,
        "scheduler.decay_iters": cfg.scheduler.decay_iters,
        "scheduler.wsd_decay_iters": cfg.scheduler.wsd_decay_iters,
        "data.max_corpus_bytes": cfg.data.max_corpus_bytes,
        "logging.log_interval": cfg.logging.log_interval,
    }
    for key, value in sizes.items():
        if value is not None and value < 1:
            return (f"{key}={value} must be at least 1; set {key} to a positive integer")
    if c.gpu_memory_gib <= 0:
        return (f"cluster.gpu_memory_gib={c.gpu_memory_gib} must be positive; set it, e.g. 80")


def check_non_negative_counts(cfg: RunConfig) -> str | None:
    """Counts and coefficients where 0 means 'off' or 'only at the end', but < 0 is meaningless."""
    values = {
        "train.eval_interval": cfg.train.eval_interval,
        "train.eval_iters": cfg.train.eval_iters,
        "checkpoint.save_interval": cfg.checkpoint.save_interval,
        "train.manual_gc_interval": cfg.train.manual_gc_interval,
        "scheduler.warmup_iters": cfg.scheduler.warmup_iters,
        "optimizer.weight_decay": cfg.optimizer.weight_decay,
        "optimizer.clip_grad": cfg.optimizer.clip_grad,
        "model.moe_aux_loss_coeff": cfg.model.moe_aux_loss_coeff,
        "model.moe_router_bias_update_rate": cfg.model.moe_router_bias_update_rate,
    }
    for key, value in values.items():
        if value < 0:
            return (f"{key}={value} must not be negative; set {key}=0 to turn it off")


def check_vocab_padding(cfg: RunConfig) -> str | None:
    """The padding unit is valid and the vocabulary covers the tokenizer's ids."""
    unit = cfg.model.make_vocab_size_divisible_by
    if unit < 1:
        return (
            f"model.make_vocab_size_divisible_by={unit} must be at least 1; "
            "set model.make_vocab_size_divisible_by=128 (Megatron's default)"
        )
    if cfg.data.tokenizer == "byte" and cfg.model.vocab_size < BYTE_VOCAB:
        return (
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the byte tokenizer's "
            f"{BYTE_VOCAB} ids; set model.vocab_size={BYTE_VOCAB} or more"
        )


def check_world_size(cfg: RunConfig) -> str | None:
    """world = TP x PP x CP x DP with DP a whole number."""
    p, layout = cfg.parallel, _layout(cfg)
    world, model_parallel = layout.world_size, layout.model_parallel
    if world % model_parallel:
        return (
            f"world size {world} ({cfg.cluster.nodes} node{'s' * (cfg.cluster.nodes != 1)} x "
            f"{cfg.cluster.gpus_per_node}) is not "
            f"divisible by TP{p.tensor} x PP{p.pipeline} x CP{p.context} = {model_parallel}, so "
            "data parallel size is not a whole number; change cluster.gpus_per_node/cluster.nodes "
            "or the parallel sizes so the product divides the world size"
        )


def _uneven_stages(cfg: RunConfig) -> str | None:
    """First/last stage layer counts (Megatron's num_layers_in_first/last_pipeline_stage): with
    pipelining, positive, divisible by VPP, leaving the middle stages an even share."""
    p, layers = cfg.parallel, cfg.model.num_layers
    vpp = p.virtual_pipeline or 1
    for name in ("first_stage_layers", "last_stage_layers"):
        value = getattr(p, name)
        if value is not None and (p.pipeline < 2 or value < 1 or value % vpp):
            return (f"parallel.{name}={value} needs parallel.pipeline >= 2 and a positive count "
                    f"divisible by VPP{vpp}; set it so, or parallel.{name}=null")
    middle = p.pipeline - (p.first_stage_layers is not None) - (p.last_stage_layers is not None)
    rest = layers - (p.first_stage_layers or 0) - (p.last_stage_layers or 0)
    if rest < 0 or bool(rest) != bool(middle) or (middle and rest % (middle * vpp)):
        return (f"model.num_layers={layers} minus parallel.first_stage_layers/last_stage_layers "
                f"leaves {rest} layers for {middle} middle stages (x VPP{vpp}); they must split "
                "evenly")
    return None


def check_layers_per_stage(cfg: RunConfig) -> str | None:
    """Layers split evenly over pipeline stages (and virtual stages with interleaving)."""
    p, layers = cfg.parallel, cfg.model.num_layers
    vpp = p.virtual_pipeline or 1
    if hybrid.has_pipes(cfg.model.hybrid_layer_pattern):
        return None  # the '|' segments place the layers (hybrid_rules.check_hybrid_segments)
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        return _uneven_stages(cfg)
    if layers % (p.pipeline * vpp):
        split = f"PP{p.pipeline} x VPP{vpp} = {p.pipeline * vpp}" if vpp > 1 else f"PP{p.pipeline}"
        return (
            f"model.num_layers={layers} cannot be split evenly over {split} model chunks; "
            "choose pipeline (x virtual_pipeline) sizes that divide the layer count"
        )


def check_virtual_pipeline(cfg: RunConfig) -> str | None:
    """Interleaving needs several pipeline stages and at least two chunks per stage."""
    p = cfg.parallel
    if p.virtual_pipeline is None:
        return
    if p.virtual_pipeline < 2:
        return (
            f"parallel.virtual_pipeline={p.virtual_pipeline} is not interleaving; "
            "set parallel.virtual_pipeline=null (off) or a value >= 2"
        )
    if p.pipeline < 2:
        return (
            f"parallel.virtual_pipeline={p.virtual_pipeline} needs parallel.pipeline > 1 "
            f"(got {p.pipeline}); set parallel.virtual_pipeline=null or raise parallel.pipeline"
        )


def check_sequence_divisible_by_context(cfg: RunConfig) -> str | None:
    """CP splits each sequence into 2 x CP load-balanced chunks."""
    seq, cp = cfg.model.seq_length, cfg.parallel.context
    if cp > 1 and seq % (2 * cp):
        return (
            f"model.seq_length={seq} must be divisible by 2 x parallel.context = {2 * cp} "
            "(context parallel splits each sequence into 2 x CP chunks); adjust one of them"
        )


def check_sequence_divisible_by_tensor(cfg: RunConfig) -> str | None:
    """Sequence parallel shards the sequence dimension over the TP group."""
    p, seq = cfg.parallel, cfg.model.seq_length
    if p.sequence_parallel and (seq // p.context) % p.tensor:
        return (
            f"with sequence parallel the per-CP-rank sequence ({seq} / CP{p.context} = "
            f"{seq // p.context}) must be divisible by parallel.tensor={p.tensor}; adjust "
            "model.seq_length or the TP size"
        )


def check_sequence_parallel_needs_tensor(cfg: RunConfig) -> str | None:
    p = cfg.parallel
    if p.sequence_parallel and p.tensor < 2:
        return (
            "parallel.sequence_parallel=true needs parallel.tensor > 1 (it shards activations "
            "over the TP group); set parallel.sequence_parallel=false or raise parallel.tensor"
        )


def _world_fields(cfg: RunConfig) -> str:
    """The fields that make the world size, the one a user sets most likely first."""
    c = cfg.cluster
    if c.nodes > 1:
        return f"cluster.nodes={c.nodes:,} (x cluster.gpus_per_node={c.gpus_per_node})"
    return f"cluster.gpus_per_node={c.gpus_per_node:,} (on cluster.nodes=1)"


def _at_most_ranks(cfg: RunConfig, world: int) -> str:
    """The fields' largest values that give at most `world` ranks: whole nodes of this size,
    else part of one node."""
    per_node = cfg.cluster.gpus_per_node
    if world >= per_node:
        return f"cluster.nodes={world // per_node:,} at most (of {per_node} ranks each)"
    return f"cluster.nodes=1 cluster.gpus_per_node={world} at most"


def check_micro_batch_within_global(cfg: RunConfig) -> str | None:
    """A micro-batch is a part of the global batch: one larger than it fills no rank at any
    world size, so fewer nodes are no answer (`check_batch_fills_data_parallel` names them)."""
    t = cfg.train
    if t.micro_batch_size <= t.global_batch_size:
        return None
    return (f"train.micro_batch_size={t.micro_batch_size} is larger than "
            f"train.global_batch_size={t.global_batch_size}, of which a micro-batch is a part; "
            f"set train.micro_batch_size={t.global_batch_size} or less, or raise "
            "train.global_batch_size")


def check_batch_fills_data_parallel(cfg: RunConfig) -> str | None:
    """Each DP rank trains at least one micro-batch of the global batch: a world so large that
    micro-batch x DP exceeds it (an absurd `cluster.nodes`) leaves ranks with nothing to train.
    Named by the world's fields, with the most nodes this batch fills; the batch's divisibility
    within that is `check_global_batch`'s."""
    t, p, layout = cfg.train, cfg.parallel, _layout(cfg)
    dp = layout.data_parallel
    if t.micro_batch_size * dp <= t.global_batch_size or check_micro_batch_within_global(cfg):
        return None
    most_dp = max(1, t.global_batch_size // t.micro_batch_size)
    return (
        f"{_world_fields(cfg)} gives world size {layout.world_size:,}, so DP{dp:,} at "
        f"TP{p.tensor} x PP{p.pipeline} x CP{p.context}, but train.global_batch_size="
        f"{t.global_batch_size} holds {t.global_batch_size // t.micro_batch_size} micro-batches "
        f"of train.micro_batch_size={t.micro_batch_size}: enough for DP{most_dp} at most; set "
        f"{_at_most_ranks(cfg, most_dp * layout.model_parallel)}, or raise "
        f"train.global_batch_size to a multiple of {t.micro_batch_size * dp:,}"
    )


def check_global_batch(cfg: RunConfig) -> str | None:
    """global batch = micro batch x DP x accumulation steps, all whole numbers (a batch
    smaller than one micro-batch per DP rank is `check_batch_fills_data_parallel`'s)."""
    t, dp = cfg.train, _layout(cfg).data_parallel
    if t.micro_batch_size * dp > t.global_batch_size:
        return None
    if t.global_batch_size % (t.micro_batch_size * dp):
        return (
            f"train.global_batch_size={t.global_batch_size} is not divisible by "
            f"train.micro_batch_size={t.micro_batch_size} x DP{dp} = {t.micro_batch_size * dp}; "
            "set the global batch to a multiple of that"
        )


def check_interleaved_microbatches(cfg: RunConfig) -> str | None:
    """The interleaved 1F1B schedule runs micro-batches in groups of PP."""
    p = cfg.parallel
    microbatches = _layout(cfg).microbatches
    if p.virtual_pipeline is not None and microbatches % p.pipeline:
        return (
            f"interleaved pipeline (virtual_pipeline={p.virtual_pipeline}) needs the "
            f"micro-batches per step ({microbatches}) divisible by "
            f"parallel.pipeline={p.pipeline}; change train.global_batch_size or "
            "train.micro_batch_size"
        )


def check_interleaved_p2p(cfg: RunConfig) -> str | None:
    """Megatron Core accepts batched p2p with interleaving but computes wrong losses."""
    p = cfg.parallel
    if p.virtual_pipeline is not None and p.batch_p2p_comm:
        return (
            "parallel.batch_p2p_comm=true with an interleaved pipeline gives silently wrong "
            "losses in Megatron Core; set parallel.batch_p2p_comm=false"
        )


def check_param_gather(cfg: RunConfig) -> str | None:
    """Param all-gather overlap exists only for the distributed optimizer's sharded params."""
    o = cfg.optimizer
    if o.overlap_param_gather and not o.distributed:
        return (
            "optimizer.overlap_param_gather=true needs the distributed optimizer; set "
            "optimizer.distributed=true or optimizer.overlap_param_gather=false"
        )
    if o.overlap_param_gather and not o.overlap_grad_reduce:
        return (
            "optimizer.overlap_param_gather=true needs optimizer.overlap_grad_reduce=true "
            "(Megatron overlaps both or neither); set both true or overlap_param_gather=false"
        )


def check_fsdp_needs_distributed_optimizer(cfg: RunConfig) -> str | None:
    """Megatron FSDP runs on the distributed optimizer; Megatron-LM switches it on itself
    (`megatron/training/arguments.py:1105-1112`), the project asks for it."""
    o = cfg.optimizer
    if o.fsdp != "none" and not o.distributed:
        return (f"optimizer.fsdp={o.fsdp} (Megatron FSDP) runs on the distributed optimizer; "
                "set optimizer.distributed=true or optimizer.fsdp=none")
    return None


def check_evaluation(cfg: RunConfig) -> str | None:
    """Periodic evaluation must evaluate something (an interval past the end means 'at the end')."""
    t = cfg.train
    if t.eval_interval > 0 and t.eval_iters == 0:
        return (
            f"train.eval_interval={t.eval_interval} with train.eval_iters=0 evaluates nothing; "
            "set train.eval_iters >= 1 or train.eval_interval=0"
        )


def check_scheduler(cfg: RunConfig) -> str | None:
    """Warm-up ends before the decay span does (Megatron asserts warmup < decay steps), and the
    WSD anneal fits inside the decay span."""
    s = cfg.scheduler
    decay = s.decay_iters if s.decay_iters is not None else cfg.train.train_iters
    if s.warmup_iters >= decay:
        source = "scheduler.decay_iters" if s.decay_iters is not None else "train.train_iters"
        return (
            f"scheduler.warmup_iters={s.warmup_iters} must be shorter than the decay span "
            f"({source}={decay}); lower scheduler.warmup_iters"
        )
    if s.style == "wsd" and s.wsd_decay_iters is not None and s.wsd_decay_iters > decay:
        return (
            f"scheduler.wsd_decay_iters={s.wsd_decay_iters} is longer than the decay span "
            f"({decay} steps); lower scheduler.wsd_decay_iters"
        )


def check_wsd_settings_need_wsd(cfg: RunConfig) -> str | None:
    """`scheduler.wsd_decay_iters` and `wsd_decay_style` shape only the WSD schedule's anneal;
    beside another style they would do nothing, as a refused FP8 or CUDA-graph setting would."""
    s = cfg.scheduler
    given = [f"scheduler.wsd_decay_iters={s.wsd_decay_iters}"] if s.wsd_decay_iters is not None \
        else []
    if s.wsd_decay_style != "linear":
        given.append(f"scheduler.wsd_decay_style={s.wsd_decay_style}")
    if s.style == "wsd" or not given:
        return None
    both = len(given) > 1
    return (f"{' and '.join(given)} {'shape' if both else 'shapes'} the WSD schedule's anneal, "
            f"but scheduler.style={s.style}; set scheduler.style=wsd or drop "
            f"{'them' if both else 'it'}")


def check_learning_rate(cfg: RunConfig) -> str | None:
    o = cfg.optimizer
    if o.lr <= 0:
        return (f"optimizer.lr={o.lr} must be positive; set optimizer.lr, e.g. 3e-4")
    if not 0 <= o.min_lr <= o.lr:
        return (
            f"optimizer.min_lr={o.min_lr} must be between 0 and optimizer.lr={o.lr}; "
            "lower optimizer.min_lr"
        )


def check_fractions(cfg: RunConfig) -> str | None:
    """Probabilities and shares lie in their intervals."""
    m = cfg.model
    for key, value in (
        ("model.hidden_dropout", m.hidden_dropout),
        ("model.attention_dropout", m.attention_dropout),
    ):
        if not 0 <= value < 1:
            return (f"{key}={value} must be in [0, 1); set it, e.g. {key}=0.0")
    share = cfg.data.heldout_fraction
    if not 0 < share < 1:
        return (f"data.heldout_fraction={share} must be in (0, 1); set it, e.g. 0.05")


def _schema_default(section: Any, name: str) -> Any:
    """The schema's default of `section.name` (the example a refusal gives)."""
    return next(f.default for f in dataclasses.fields(section) if f.name == name)


def check_adam_betas(cfg: RunConfig) -> str | None:
    """Adam's moment decays: torch's Adam refuses a beta outside [0, 1) (`torch/optim/adam.py`),
    but only on the ranks, once Megatron builds the optimizer (a traceback per rank)."""
    o = cfg.optimizer
    for name in ("adam_beta1", "adam_beta2"):
        value = getattr(o, name)
        if not 0 <= value < 1:
            return (f"optimizer.{name}={value:g} must be in [0, 1) (the decay of Adam's moment "
                    f"estimates); set it, e.g. optimizer.{name}={_schema_default(o, name):g}")
    return None


def check_adam_eps(cfg: RunConfig) -> str | None:
    """Adam divides by sqrt(v) + eps: torch refuses a negative eps on the ranks, and 0 divides
    by zero where a gradient has been zero so far."""
    eps = cfg.optimizer.adam_eps
    if eps <= 0:
        return (f"optimizer.adam_eps={eps:g} must be positive (Adam divides by sqrt(v) + eps); "
                f"set it, e.g. optimizer.adam_eps={_schema_default(cfg.optimizer, 'adam_eps'):g}")
    return None


def check_init_method_std(cfg: RunConfig) -> str | None:
    """The std of the normal weight init: torch's `normal_` refuses a negative one on the ranks,
    and 0 starts every weight at zero (every head and channel the same, for good)."""
    std = cfg.model.init_method_std
    if std <= 0:
        return (f"model.init_method_std={std:g} must be positive (the std of the normal weight "
                f"init); set it, e.g. model.init_method_std="
                f"{_schema_default(cfg.model, 'init_method_std'):g}")
    return None


# numpy seeds 32-bit: np.random.seed takes 0 .. 2**32 - 1.
SEED_LIMIT = 2**32 - 1
# Each pipeline stage draws its own stream from train.seed + 100 x its stage (Megatron-LM's
# convention, trainer/session.py `set_seeds`).
SEED_STAGE_STRIDE = 100


def check_seed(cfg: RunConfig) -> str | None:
    """Every rank seeds numpy, Python and torch with `train.seed + 100 x pipeline stage`; numpy
    refuses a seed below 0 or above 2**32 - 1, on the ranks, with a traceback."""
    seed, stages = cfg.train.seed, cfg.parallel.pipeline
    most = SEED_LIMIT - SEED_STAGE_STRIDE * (stages - 1)
    if 0 <= seed <= most:
        return None
    stride = (f" (each of the {stages} pipeline stages seeds train.seed + "
              f"{SEED_STAGE_STRIDE} x its stage)" if stages > 1 else "")
    return (f"train.seed={seed} must be between 0 and {most:,}{stride}; numpy takes 32-bit "
            f"seeds; set it, e.g. train.seed={_schema_default(cfg.train, 'seed')}")


def check_rope_scaling_factor(cfg: RunConfig) -> str | None:
    """Llama 3.1's RoPE scaling divides the low frequencies by the factor: 0 makes them
    infinite, a negative one turns them around."""
    factor = cfg.model.rope_scaling_factor
    if factor is None or factor > 0:
        return None
    return (f"model.rope_scaling_factor={factor:g} must be positive; set it, e.g. "
            "model.rope_scaling_factor=8.0 (Llama 3.1), or model.rope_scaling_factor=null for "
            "no scaling")


def check_cuda_graph_warmup_steps(cfg: RunConfig) -> str | None:
    """Graphs are captured after this many eager steps: a negative count never comes, so the
    graphs would silently never be captured."""
    steps = cfg.train.cuda_graph_warmup_steps
    if steps >= 0:
        return None
    return (f"train.cuda_graph_warmup_steps={steps} must not be negative (eager steps before "
            "the CUDA graphs are captured); set it, e.g. train.cuda_graph_warmup_steps="
            f"{_schema_default(cfg.train, 'cuda_graph_warmup_steps')}")


def check_cuda_graph_warmup_with_offloading(cfg: RunConfig) -> str | None:
    """Megatron asserts at least one warm-up step when graphs meet activation offloading
    (`transformer/transformer_config.py:2630`), on the ranks."""
    t = cfg.train
    if t.cuda_graphs == "none" or not t.offload_modules or t.cuda_graph_warmup_steps != 0:
        return None
    return ("train.cuda_graph_warmup_steps=0 with train.offload_modules: Megatron needs at least "
            "one eager step before capturing graphs that offload activations; set "
            "train.cuda_graph_warmup_steps=1 or more")


def check_data_source(cfg: RunConfig) -> str | None:
    """A blend is named exactly when it is the source; document modes other than concatenation
    need a blend (they produce packed batches; the packing plugin's own rule asks for it)."""
    d = cfg.data
    if d.source == "blend" and d.blend is None:
        return ("data.source=blend needs data.blend=<file>; name one, e.g. "
                "data.blend=conf/data/python_stdlib.yaml")
    if d.source != "blend" and d.blend is not None:
        return (f"data.blend={d.blend} is set but data.source={d.source}; set data.source=blend "
                "or data.blend=null")
    if d.documents != "concatenate" and d.source != "blend":
        return (f"data.documents={d.documents} needs prepared data (data.source=blend); set "
                "data.source=blend data.blend=<file> or data.documents=concatenate")
    return None


def check_documents_keep_eod_mask(cfg: RunConfig) -> str | None:
    """Rows of whole documents (inter-document or packed) must not train a label across a
    document boundary: the end-of-document mask stays on."""
    d = cfg.data
    if d.documents != "concatenate" and not d.eod_mask_loss:
        return (f"data.documents={d.documents} needs data.eod_mask_loss=true (no label may cross "
                "a document boundary); set data.eod_mask_loss=true")
    return None


def check_checkpoint_load(cfg: RunConfig) -> str | None:
    if cfg.checkpoint.load_model_only and cfg.checkpoint.load is None:
        return (
            "checkpoint.load_model_only=true needs a checkpoint to load; set "
            "checkpoint.load=<checkpoint dir> or checkpoint.load_model_only=false"
        )


def check_resume_needs_run_dir(cfg: RunConfig) -> str | None:
    """`checkpoint.resume` continues the run in its own directory, so that directory must be
    named: a made-up `<output_dir>/<name>-<time>` is new on every start and holds nothing."""
    if cfg.checkpoint.resume and cfg.run_dir is None:
        return ("checkpoint.resume=true needs an explicit run_dir (it continues the run saved "
                "there); set run_dir=<run directory>, e.g. run_dir=runs/my-run, or "
                "checkpoint.resume=false")
    return None


def check_resume_or_load(cfg: RunConfig) -> str | None:
    """`checkpoint.resume` and `checkpoint.load` each say where the run starts from."""
    load = cfg.checkpoint.load
    if cfg.checkpoint.resume and load is not None:
        return (f"checkpoint.resume=true and checkpoint.load={load} both say where to start; "
                "keep one: checkpoint.load=null to continue this run_dir's own checkpoints, or "
                "checkpoint.resume=false to start from checkpoint.load")
    return None


def check_keep_last(cfg: RunConfig) -> str | None:
    """Rotation keeps the newest `keep_last` steps; keeping none would delete every save."""
    keep = cfg.checkpoint.keep_last
    if keep is not None and keep < 1:
        return (f"checkpoint.keep_last={keep} must be at least 1; set checkpoint.keep_last=1 or "
                "more, or checkpoint.keep_last=null to keep every checkpoint")
    return None


def check_async_save_needs_saves(cfg: RunConfig) -> str | None:
    """`checkpoint.async_save` changes how checkpoints are written; with saving off it would
    silently do nothing."""
    c = cfg.checkpoint
    if c.async_save and not c.save:
        return ("checkpoint.async_save=true writes checkpoints in the background, but "
                "checkpoint.save=false writes none; set checkpoint.save=true (with "
                "checkpoint.save_interval=N) or checkpoint.async_save=false")
    return None


def check_megatron_lm_format_needs_saves(cfg: RunConfig) -> str | None:
    """`checkpoint.format` says how checkpoints are written; with saving off it would silently
    do nothing."""
    c = cfg.checkpoint
    if c.format == "megatron_lm" and not c.save:
        return ("checkpoint.format=megatron_lm writes checkpoints Megatron-LM resumes, but "
                "checkpoint.save=false writes none; set checkpoint.save=true (with "
                "checkpoint.save_interval=N) or leave checkpoint.format at mcore_recipes")
    return None


def check_distributed_timeout(cfg: RunConfig) -> str | None:
    """A collective timeout of zero minutes or less would fail the first collective (or never
    time out); torch needs a positive one."""
    for key, default in (("distributed_timeout_minutes", 10), ("data_setup_timeout_minutes", 60)):
        minutes = getattr(cfg.train, key)
        if minutes <= 0:
            return (f"train.{key}={minutes} must be at least 1 (minutes a rank waits in a "
                    f"collective); set it, e.g. train.{key}={default}")
    return None


Rule = Callable[[RunConfig], str | None]

def check_phase_layouts(cfg: RunConfig) -> str | None:
    """Each phase's batch, sequence, CP size, micro-batch and documents meet what the run's own
    must (a phase's own config through the size rules, the data source's and the plugins'
    rules: a phase of packed rows meets the packing plugin's and keeps the end-of-document
    mask), before the first launch rather than at the phase's relaunch."""
    return check_each_phase(cfg, (
        check_world_size, check_sequence_divisible_by_context, check_sequence_divisible_by_tensor,
        check_micro_batch_within_global, check_batch_fills_data_parallel, check_global_batch,
        check_interleaved_microbatches, check_documents_keep_eod_mask,
        fast_paths.check_te_graphs_with_packed_rows, *cfg.plugins.rules(),
    ))


RULES: tuple[Rule, ...] = (
    check_finite_numbers,
    check_empty_strings,
    check_name_is_a_name,
    check_positive_sizes,
    check_non_negative_counts,
    check_vocab_padding,
    check_world_size,
    *gpt_rules.RULES,
    *hybrid_rules.RULES,
    check_virtual_pipeline,
    check_layers_per_stage,
    check_sequence_divisible_by_context,
    check_sequence_parallel_needs_tensor,
    check_sequence_divisible_by_tensor,
    check_micro_batch_within_global,
    check_batch_fills_data_parallel,
    check_global_batch,
    check_interleaved_microbatches,
    check_interleaved_p2p,
    *moe_rules.RULES,
    *fast_paths.RULES,
    check_param_gather,
    check_fsdp_needs_distributed_optimizer,
    *SHARDING_RULES,
    check_evaluation,
    check_scheduler,
    check_wsd_settings_need_wsd,
    check_learning_rate,
    check_fractions,
    check_adam_betas,
    check_adam_eps,
    check_init_method_std,
    check_seed,
    check_rope_scaling_factor,
    check_cuda_graph_warmup_steps,
    check_cuda_graph_warmup_with_offloading,
    check_checkpoint_load,
    check_resume_needs_run_dir,
    check_resume_or_load,
    check_keep_last,
    check_async_save_needs_saves,
    check_megatron_lm_format_needs_saves,
    check_data_source,
    check_documents_keep_eod_mask,
    check_distributed_timeout,
    *PHASE_RULES,
    check_phase_layouts,
    *RAMPUP_RULES,
)


def all_rules(cfg: RunConfig) -> tuple[Rule, ...]:
    """The core rules, the precision section's (fp16 loss scaling, beside `PrecisionConfig`),
    then each plugin's own rules (from the plugin configs `cfg` holds)."""
    return (*RULES, *cfg.precision.rules(), *cfg.plugins.rules())


# Rules whose failure makes the later ones meaningless (a size of zero divides nothing): when
# one of them fails, the problems found are theirs alone.
GATE_RULES: tuple[Rule, ...] = (check_finite_numbers, check_positive_sizes)


def each_problem(cfg: RunConfig, rules: Iterable[Rule]) -> list[str]:
    """The message of every rule in `rules` that `cfg` breaks, in order. A rule that cannot
    judge a config an earlier one refused (it raises) is passed over: its own error would hide
    the refusal that explains it. Before any refusal the error is raised."""
    problems: list[str] = []
    for rule in rules:
        try:
            message = rule(cfg)
        except Exception:  # noqa: BLE001 - only after another rule's refusal (re-raised else)
            if not problems:
                raise
            continue
        if message:
            problems.append(message)
    return problems


def rule_problems(cfg: RunConfig, extra: Sequence[Rule] = ()) -> list[str]:
    """The message of every rule `cfg` breaks, in `all_rules` order then `extra` (what a user
    fixes in one go). After a gate rule fails only the gates are asked; a later rule that
    cannot judge a config an earlier one refused is passed over (`each_problem`)."""
    problems = [message for rule in GATE_RULES if (message := rule(cfg))]
    if problems:
        return problems
    return each_problem(cfg, (rule for rule in (*all_rules(cfg), *extra)
                              if rule not in GATE_RULES))


def validate(cfg: RunConfig, extra: Sequence[Rule] = (), *, every: bool = False) -> None:
    """Raise `ConfigError` with the message of the first rule `cfg` breaks (`all_rules` order,
    then `extra`: rules of a program above this floor, e.g. the trainer's own); `every=True`:
    with every rule's message (`rule_problems`, a `ConfigErrors` when several), as the
    command line is checked before launch."""
    if every:
        error = config_error(rule_problems(cfg, extra))
        if error is not None:
            raise error
        return
    for rule in (*all_rules(cfg), *extra):
        message = rule(cfg)
        if message:
            raise ConfigError(message)


def failing_rules(cfg: RunConfig) -> list[str]:
    """Names of every rule `cfg` breaks (for tests and reports; assumes positive sizes)."""
    return [rule.__name__ for rule in all_rules(cfg) if rule(cfg)]
