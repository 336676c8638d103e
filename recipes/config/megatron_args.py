"""A run config as Megatron-LM's `pretrain_gpt.py` command line (`pretrain_hybrid.py` for a
hybrid model), and back.

One table says which Megatron-LM flag carries each config field and how: a value
(`--num-layers 32`), a switch that is on when the field is true (`--sequence-parallel`) or
false (`--disable-bias-linear`), or a pair of functions for the fields Megatron-LM spells
another way (the activation, the precision, recompute, the schedule, GQA, RoPE scaling, the
data, the checkpoint format, a batch ramp-up: Megatron-LM 0.19.2 ignores `--rampup-batch-size`
and ramps only through its step schedule, counted in samples); a plugin writes and reads its
own flags (FP8's, through its config's `megatron_lm_args` / `from_megatron_lm`). Every field the
model has is written, since Megatron-LM's defaults are not ours (dropout 0.1, Adam beta2 0.999,
linear decay...); a dense model's line carries no MoE flag, and a line without RoPE no RoPE
flag. The world size is not a flag (torchrun gives it) and the fields `no_flag_fields` names
have no Megatron-LM flag; `scripts/pretrain.py print=megatron_args` lists them. Reading a
command line back (`trainer/tools/megatron_args.py`) uses Megatron-LM's own parser and this
same table, so the two directions cannot drift apart. No torch here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from plugins.registry import PluginsConfig

VALUE, ON, OFF = "value", "on", "off"


@dataclass(frozen=True)
class Flag:
    field: str  # 'section.name' in the run config
    flag: str  # Megatron-LM's option string
    dest: str = ""  # the attribute Megatron-LM's parser stores it in (default: argparse's)
    kind: str = VALUE  # VALUE, ON (store_true when the field is true), OFF (set when false)
    # Written only for the models that have the field (`when(cfg)`). Read back, a flag the
    # line does not type is left at the project's default where `when` fails on the fields
    # read (`from_megatron_values`): Megatron-LM's default may differ (its dispatcher is
    # allgather, ours alltoall) but trains nothing there; a flag typed is read all the same.
    when: Callable[[Any], bool] | None = None

    def __post_init__(self) -> None:
        if not self.dest:  # argparse's own dest for the option: '--num-layers' -> 'num_layers'
            object.__setattr__(self, "dest", self.flag.lstrip("-").replace("-", "_"))


def _moe(cfg: Any) -> bool:
    return cfg.model.num_moe_experts is not None


def _flex(cfg: Any) -> bool:
    """The flex dispatcher's backend is read by that dispatcher only."""
    return _moe(cfg) and cfg.model.moe_token_dispatcher == "flex"


def _rope(cfg: Any) -> bool:
    """RoPE's base, share and scaling are read by the rotary embedding only."""
    return cfg.model.position_embedding == "rope"


def _hybrid(cfg: Any) -> bool:
    return cfg.model.hybrid_layer_pattern is not None


def _no_ramp(cfg: Any) -> bool:
    """Without a batch ramp-up the run's length and schedule are steps of one global batch; with
    one Megatron-LM counts them in samples (`_ramp_args`)."""
    return cfg.train.rampup_batch_size is None


FLAGS: tuple[Flag, ...] = (
    Flag("model.num_layers", "--num-layers"),
    Flag("model.hidden_size", "--hidden-size"),
    Flag("model.ffn_hidden_size", "--ffn-hidden-size"),
    Flag("model.num_attention_heads", "--num-attention-heads"),
    Flag("model.kv_channels", "--kv-channels"),
    Flag("model.seq_length", "--seq-length"),
    Flag("model.vocab_size", "--vocab-size"),
    Flag("model.make_vocab_size_divisible_by", "--make-vocab-size-divisible-by"),
    Flag("model.normalization", "--normalization"),
    Flag("model.position_embedding", "--position-embedding-type"),
    Flag("model.rotary_base", "--rotary-base", when=_rope),
    Flag("model.rotary_percent", "--rotary-percent", when=_rope),
    Flag("model.layernorm_zero_centered_gamma", "--apply-layernorm-1p",
         "layernorm_zero_centered_gamma", ON),
    Flag("model.add_bias_linear", "--disable-bias-linear", "add_bias_linear", OFF),
    Flag("model.hidden_dropout", "--hidden-dropout"),
    Flag("model.attention_dropout", "--attention-dropout"),
    Flag("model.attention_softmax_in_fp32", "--attention-softmax-in-fp32", kind=ON),
    Flag("model.init_method_std", "--init-method-std"),
    Flag("model.num_moe_experts", "--num-experts"),
    # The experts and their routing (Nemotron 3, DeepSeek-V3): written for MoE models only.
    Flag("model.moe_router_topk", "--moe-router-topk", when=_moe),
    Flag("model.moe_ffn_hidden_size", "--moe-ffn-hidden-size", when=_moe),
    Flag("model.moe_token_dispatcher", "--moe-token-dispatcher-type", when=_moe),
    Flag("model.moe_aux_loss_coeff", "--moe-aux-loss-coeff", when=_moe),
    Flag("model.moe_load_balancing", "--moe-router-load-balancing-type", when=_moe),
    Flag("model.moe_router_score_function", "--moe-router-score-function", when=_moe),
    Flag("model.moe_router_expert_bias", "--moe-router-enable-expert-bias", kind=ON, when=_moe),
    Flag("model.moe_router_bias_update_rate", "--moe-router-bias-update-rate", when=_moe),
    Flag("model.moe_router_topk_scaling_factor", "--moe-router-topk-scaling-factor", when=_moe),
    Flag("model.moe_shared_expert_ffn_hidden_size", "--moe-shared-expert-intermediate-size",
         when=_moe),
    Flag("model.moe_latent_size", "--moe-latent-size", when=_moe),
    # The hybrid Mamba-Transformer's Mamba2 sizes (pretrain_hybrid.py): hybrids only. Its MTP
    # depths are the pattern's parts after '/' (Megatron-LM infers --mtp-num-layers from them).
    Flag("model.mtp_loss_scaling_factor", "--mtp-loss-scaling-factor", when=_hybrid),
    Flag("model.mtp_use_repeated_layer", "--mtp-use-repeated-layer", kind=ON, when=_hybrid),
    Flag("model.mamba_state_dim", "--mamba-state-dim", when=_hybrid),
    Flag("model.mamba_head_dim", "--mamba-head-dim", when=_hybrid),
    Flag("model.mamba_num_heads", "--mamba-num-heads", when=_hybrid),
    Flag("model.mamba_num_groups", "--mamba-num-groups", when=_hybrid),
    Flag("parallel.tensor", "--tensor-model-parallel-size"),
    Flag("parallel.pipeline", "--pipeline-model-parallel-size"),
    Flag("parallel.virtual_pipeline", "--num-virtual-stages-per-pipeline-rank"),
    Flag("parallel.context", "--context-parallel-size"),
    Flag("parallel.expert", "--expert-model-parallel-size", when=_moe),
    Flag("parallel.expert_tensor", "--expert-tensor-parallel-size", when=_moe),
    Flag("parallel.sequence_parallel", "--sequence-parallel", kind=ON),
    Flag("parallel.first_stage_layers", "--decoder-first-pipeline-num-layers"),
    Flag("parallel.last_stage_layers", "--decoder-last-pipeline-num-layers"),
    Flag("parallel.overlap_p2p_comm", "--no-overlap-p2p-communication", "overlap_p2p_comm", OFF),
    Flag("train.micro_batch_size", "--micro-batch-size"),
    Flag("train.global_batch_size", "--global-batch-size", when=_no_ramp),
    Flag("train.train_iters", "--train-iters", when=_no_ramp),
    Flag("train.eval_interval", "--eval-interval"),
    Flag("train.eval_iters", "--eval-iters"),
    Flag("train.seed", "--seed"),
    Flag("train.distributed_timeout_minutes", "--distributed-timeout-minutes"),
    Flag("optimizer.lr", "--lr"),
    Flag("optimizer.min_lr", "--min-lr"),
    Flag("optimizer.weight_decay", "--weight-decay"),
    Flag("optimizer.adam_beta1", "--adam-beta1"),
    Flag("optimizer.adam_beta2", "--adam-beta2"),
    Flag("optimizer.adam_eps", "--adam-eps"),
    Flag("optimizer.clip_grad", "--clip-grad"),
    Flag("optimizer.overlap_grad_reduce", "--overlap-grad-reduce", kind=ON),
    Flag("optimizer.overlap_param_gather", "--overlap-param-gather", kind=ON),
    Flag("optimizer.bucket_size", "--ddp-bucket-size"),
    # torch's FSDP2 (Megatron Core's TorchFullyShardedDataParallel): the project's validation
    # refuses it with the reason, so a line read back says why rather than "no field".
    Flag("optimizer.torch_fsdp2", "--use-torch-fsdp2", kind=ON),
    Flag("scheduler.warmup_iters", "--lr-warmup-iters", when=_no_ramp),
    Flag("scheduler.decay_iters", "--lr-decay-iters", when=_no_ramp),
    Flag("scheduler.wsd_decay_style", "--lr-wsd-decay-style"),
    Flag("precision.grad_reduce_in_fp32", "--accumulate-allreduce-grads-in-fp32", kind=ON),
    Flag("precision.loss_scale", "--loss-scale"),
    Flag("precision.initial_loss_scale", "--initial-loss-scale"),
    Flag("precision.min_loss_scale", "--min-loss-scale"),
    Flag("precision.loss_scale_window", "--loss-scale-window"),
    Flag("precision.hysteresis", "--hysteresis"),
    Flag("data.eod_mask_loss", "--eod-mask-loss", kind=ON),
    Flag("checkpoint.save_interval", "--save-interval"),
    Flag("checkpoint.load", "--load"),
    Flag("logging.log_interval", "--log-interval"),
    # The GPU fast paths (recipes/config/fast_paths.py); the experts' for MoE models only.
    Flag("model.moe_grouped_gemm", "--moe-grouped-gemm", kind=ON, when=_moe),
    Flag("model.moe_permute_fusion", "--moe-permute-fusion", kind=ON, when=_moe),
    Flag("model.moe_router_fusion", "--moe-router-fusion", kind=ON, when=_moe),
    Flag("model.moe_shared_expert_overlap", "--moe-shared-expert-overlap", kind=ON, when=_moe),
    Flag("model.moe_fused_squared_relu", "--use-fused-weighted-squared-relu",
         "use_fused_weighted_squared_relu", ON, when=_moe),
    Flag("parallel.tp_comm_overlap", "--tp-comm-overlap", kind=ON),
    Flag("model.gradient_accumulation_fusion", "--no-gradient-accumulation-fusion",
         "gradient_accumulation_fusion", OFF),
    Flag("parallel.ep_comm_overlap", "--overlap-moe-expert-parallel-comm",
         "overlap_moe_expert_parallel_comm", ON, when=_moe),
)

_STYLES = {"cosine": "cosine", "wsd": "WSD", "linear": "linear", "constant": "constant"}


@dataclass(frozen=True)
class Spelled:
    """Fields Megatron-LM spells another way: their flags from the config, and back."""

    fields: tuple[str, ...]
    dests: tuple[str, ...]  # what the reverse reads from Megatron-LM's parsed arguments
    to_args: Callable[[Any], list[str]]
    from_args: Callable[[Mapping[str, Any]], dict[str, Any]]
    when: Callable[[Any], bool] | None = None  # as `Flag.when`, for all of `dests`


def _activation_args(cfg: Any) -> list[str]:
    return {"swiglu": ["--swiglu"], "squared_relu": ["--squared-relu"], "gelu": []}[
        cfg.model.activation]


def _activation_from(a: Mapping[str, Any]) -> dict[str, Any]:
    name = "swiglu" if a["swiglu"] else "squared_relu" if a["squared_relu"] else "gelu"
    return {"model.activation": name}


def _groups_args(cfg: Any) -> list[str]:
    groups = cfg.model.num_query_groups
    return [] if groups is None else ["--group-query-attention", "--num-query-groups",
                                      str(groups)]


def _groups_from(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"model.num_query_groups": a["num_query_groups"] if a["group_query_attention"]
            else None}


def _rope_args(cfg: Any) -> list[str]:
    factor = cfg.model.rope_scaling_factor
    return [] if factor is None else ["--use-rope-scaling", "--rope-scaling-factor", str(factor)]


def _rope_from(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"model.rope_scaling_factor": a["rope_scaling_factor"] if a["use_rope_scaling"]
            else None}


def _tied_args(cfg: Any) -> list[str]:
    return [] if cfg.model.share_embeddings_and_output_weights else [
        "--untie-embeddings-and-output-weights"]


def _tied_from(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"model.share_embeddings_and_output_weights":
            not a["untie_embeddings_and_output_weights"]}


def _impl_args(cfg: Any) -> list[str]:
    impl = cfg.model.transformer_impl
    return [] if impl == "auto" else ["--transformer-impl", impl]


def _impl_from(a: Mapping[str, Any]) -> dict[str, Any]:
    # No flag means Megatron-LM's default, Transformer Engine: ours is 'auto' (TE on GPUs).
    given = a.get("__given__", ())
    return {"model.transformer_impl": a["transformer_impl"] if "transformer_impl" in given
            else "auto"}


def _precision_args(cfg: Any) -> list[str]:
    return {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": []}[cfg.precision.dtype]


def _precision_from(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"precision.dtype": "bf16" if a["bf16"] else "fp16" if a["fp16"] else "fp32"}


def _recompute_args(cfg: Any) -> list[str]:
    t = cfg.train
    if t.recompute == "none":
        return []
    if t.recompute == "selective":
        return ["--recompute-granularity", "selective", "--recompute-modules",
                *t.recompute_modules]
    return ["--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", str(t.recompute_num_layers)]


def recompute_flags_problem(a: Mapping[str, Any]) -> str | None:
    """What Megatron-LM refuses of the recompute flags (training/arguments.py:1385-1388,
    transformer_config.py:1734-1756), and the block method this project does not train (its
    full recompute is uniform), in one line; None when they are whole."""
    granularity, method = a["recompute_granularity"], a["recompute_method"]
    layers = a["recompute_num_layers"]
    if granularity == "selective" and method is not None:
        return (f"--recompute-method {method} with --recompute-granularity selective: "
                "Megatron-LM takes a method for full recompute only; drop --recompute-method")
    if granularity == "selective" and layers is not None:
        return (f"--recompute-num-layers {layers} with --recompute-granularity selective: "
                "Megatron asserts it is unset there; drop --recompute-num-layers")
    if granularity != "full":
        return None
    if method is None or layers is None:
        missing = "--recompute-method uniform" if method is None else "--recompute-num-layers N"
        return (f"--recompute-granularity full needs {missing} (Megatron asserts it); add it")
    if method != "uniform":
        return (f"--recompute-method {method}: this project's full recompute is uniform "
                "(train.recompute=full, train.recompute_num_layers); use --recompute-method "
                "uniform")
    return None


def _recompute_from(a: Mapping[str, Any]) -> dict[str, Any]:
    problem = recompute_flags_problem(a)
    if problem:
        from plugins.protocol.errors import ConfigError

        raise ConfigError(problem)
    granularity = a["recompute_granularity"] or ("selective" if a["recompute_activations"]
                                                 else None)
    return {"train.recompute": granularity or "none",
            "train.recompute_num_layers": a["recompute_num_layers"] or 1,
            # Megatron's own default list (transformer_config.py:1763-1764).
            "train.recompute_modules": list(a["recompute_modules"] or ["core_attn"])}


def _gc_args(cfg: Any) -> list[str]:
    every = cfg.train.manual_gc_interval
    return ["--manual-gc", "--manual-gc-interval", str(every)] if every else []


def _gc_from(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"train.manual_gc_interval": a["manual_gc_interval"] if a["manual_gc"] else 0}


def _wsd_args(cfg: Any) -> list[str]:
    """WSD's anneal as the trainer resolves it: Megatron-LM's WSD scheduler has no default."""
    from recipes.config.phases import wsd_decay_iters

    s = cfg.scheduler
    if (s.style != "wsd" and s.wsd_decay_iters is None) or not _no_ramp(cfg):
        return []  # with a ramp-up: --lr-wsd-decay-samples (`_ramp_args`)
    return ["--lr-wsd-decay-iters", str(wsd_decay_iters(s, cfg.train.train_iters))]


def _wsd_from(a: Mapping[str, Any]) -> dict[str, Any]:
    from recipes.config.phases import wsd_decay_iters
    from recipes.config.schema import SchedulerConfig

    given, train = a["lr_wsd_decay_iters"], a["train_iters"]
    default = None  # the trainer's own resolution, read back as unset
    if a["lr_decay_iters"] or train:
        default = wsd_decay_iters(SchedulerConfig(decay_iters=a["lr_decay_iters"]), train)
    return {"scheduler.wsd_decay_iters": None if given == default else given}


# What this trainer always does and Megatron-LM does only when told: written on every command
# line, and named when a command line read in lacks it (it would train something else).
ALWAYS_ON = (
    ("--calculate-per-token-loss", "calculate_per_token_loss",
     "every loss token of the global batch weighs alike; without the flag Megatron-LM "
     "averages each micro-batch's mean"),
)


def _always_args(cfg: Any) -> list[str]:
    return [flag for flag, _, _ in ALWAYS_ON]


def _always_from(a: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def missing_always_on(given: frozenset[str] | set[str]) -> list[str]:
    """One note per ALWAYS_ON flag a Megatron-LM command line did not type."""
    return [f"{flag} is not given, but this project always trains so ({why})"
            for flag, dest, why in ALWAYS_ON if dest not in given]


def softmax_precision_note(given: frozenset[str] | set[str], dtype: str) -> list[str]:
    """A bf16/fp16 command line without `--attention-softmax-in-fp32` normalises attention
    scores in its own precision, as Megatron-LM does; this project's default is fp32, so the
    reading says which it takes."""
    if dtype == "fp32" or "attention_softmax_in_fp32" in given:
        return []
    return [f"--attention-softmax-in-fp32 is not given: the attention softmax trains in {dtype} "
            "as Megatron-LM's does (model.attention_softmax_in_fp32=false; this project's "
            "default is true)"]


def _style_args(cfg: Any) -> list[str]:
    return ["--lr-decay-style", _STYLES[cfg.scheduler.style]]


def _style_from(a: Mapping[str, Any]) -> dict[str, Any]:
    back = {v: k for k, v in _STYLES.items()}
    return {"scheduler.style": back.get(a["lr_decay_style"], a["lr_decay_style"])}


def _data_args(cfg: Any) -> list[str]:
    """Synthetic data is Megatron-LM's mock data; the byte tokenizer is its null tokenizer
    over the same vocabulary. The built-in corpus and a blend's prefixes are not flags."""
    args = ["--tokenizer-type", "NullTokenizer", "--max-position-embeddings",
            str(cfg.model.seq_length)]
    return args + (["--mock-data"] if cfg.data.source == "synthetic" else [])


def _data_from(a: Mapping[str, Any]) -> dict[str, Any]:
    """Mock data is synthetic; a --data-path needs a blend file of prepared prefixes
    (conf/data/), which the reader names: data.source=blend data.blend=..."""
    return {"data.source": "synthetic"} if a["mock_data"] else {}


def _fsdp_args(cfg: Any) -> list[str]:
    fsdp = cfg.optimizer.fsdp
    return [] if fsdp == "none" else [
        "--use-megatron-fsdp", "--data-parallel-sharding-strategy", fsdp,
        "--ckpt-format", "fsdp_dtensor"]  # Megatron-LM's FSDP saves only this format


def _distributed_args(cfg: Any) -> list[str]:
    return ["--use-distributed-optimizer"] if cfg.optimizer.distributed else []


def _distributed_from(a: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron-LM turns the distributed optimizer on for Megatron FSDP itself
    (training/arguments.py:1106-1112), so a line with --use-megatron-fsdp alone has it."""
    return {"optimizer.distributed": bool(a["use_distributed_optimizer"]
                                          or a["use_megatron_fsdp"])}


def _fsdp_from(a: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron-LM saves Megatron FSDP as fsdp_dtensor and only it so (arguments.py:1146-1147,
    :1620-1621), as the trainer does; any other --ckpt-format is the project's own choice."""
    from plugins.protocol.errors import ConfigError

    if (a["ckpt_format"] == "fsdp_dtensor") != bool(a["use_megatron_fsdp"]):
        raise ConfigError(f"--ckpt-format {a['ckpt_format']} with"
                          f"{'' if a['use_megatron_fsdp'] else 'out'} --use-megatron-fsdp: "
                          "Megatron-LM saves Megatron FSDP as fsdp_dtensor and only it so; "
                          "give both or neither")
    if not a["use_megatron_fsdp"]:
        return {"optimizer.fsdp": "none"}
    strategy = a["data_parallel_sharding_strategy"]
    if strategy not in ("optim", "optim_grads", "optim_grads_params"):
        raise ConfigError(f"--data-parallel-sharding-strategy {strategy} is not one the project "
                          "trains (optim, optim_grads, optim_grads_params); for plain data "
                          "parallelism drop --use-megatron-fsdp")
    return {"optimizer.fsdp": strategy}


def _optimizer_offload_args(cfg: Any) -> list[str]:
    o = cfg.optimizer
    return [] if not o.cpu_offload else [
        "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
        "--optimizer-offload-fraction", _text(o.offload_fraction)]


def _optimizer_offload_from(a: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron-LM offloads through its precision-aware optimizer (arguments.py:1803-1807); on
    its own that flag is Transformer Engine's FusedAdam with low-precision state, which the
    project does not train."""
    if a["optimizer_cpu_offload"] and not a["use_precision_aware_optimizer"]:
        from plugins.protocol.errors import ConfigError

        raise ConfigError("--optimizer-cpu-offload without --use-precision-aware-optimizer: "
                          "Megatron-LM asserts the offload runs through that flag's code path; "
                          "add --use-precision-aware-optimizer")
    if a["use_precision_aware_optimizer"] and not a["optimizer_cpu_offload"]:
        from plugins.protocol.errors import ConfigError

        raise ConfigError("--use-precision-aware-optimizer without --optimizer-cpu-offload is "
                          "Transformer Engine's FusedAdam with low-precision state, which the "
                          "project does not train; drop it")
    if not a["optimizer_cpu_offload"]:
        return {"optimizer.cpu_offload": False}
    return {"optimizer.cpu_offload": True,
            "optimizer.offload_fraction": a["optimizer_offload_fraction"]}


def _format_args(cfg: Any) -> list[str]:
    return (["--dist-ckpt-optim-fully-reshardable"]
            if cfg.checkpoint.optimizer_format == "fully_reshardable" else [])


def _format_from(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"checkpoint.optimizer_format": "fully_reshardable"
            if a["dist_ckpt_optim_fully_reshardable"] else "dp_reshardable"}


def _async_args(cfg: Any) -> list[str]:
    return ["--async-save", "--use-persistent-ckpt-worker"] if cfg.checkpoint.async_save else []


def _async_from(a: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron-LM 0.19.2 saves a distributed checkpoint asynchronously only through its
    persistent worker: `--async-save` alone it turns off with a warning (arguments.py:1740-1746),
    so a line with it alone would plan saves Megatron-LM does not make in the background."""
    if a["async_save"] and not a["use_persistent_ckpt_worker"]:
        from plugins.protocol.errors import ConfigError

        raise ConfigError("--async-save without --use-persistent-ckpt-worker: Megatron-LM 0.19.2 "
                          "turns asynchronous saving off without its persistent worker; add "
                          "--use-persistent-ckpt-worker, or remove --async-save")
    return {"checkpoint.async_save": bool(a["async_save"])}


def _ramp_args(cfg: Any) -> list[str]:
    """A batch ramp-up as Megatron-LM 0.19.2 trains one. It ignores `--rampup-batch-size`
    (Megatron Core deprecated that calculator, `num_microbatches_calculator.py:79-104`) and ramps
    through `--step-batch-size-schedule`, the same (threshold, batch) pairs the trainer hands
    Megatron Core (`recipes/config/rampup.py`), its thresholds in tokens (Megatron-LM passes
    `--seq-length`, which turns them into samples). It refuses that schedule beside
    `--global-batch-size` (the schedule's last batch is the full one) and with `--train-iters`
    would count the learning-rate schedule in steps of micro-batch x DP samples, so the length
    and the schedule are written in samples, as the trainer counts them under a ramp."""
    from recipes.config.phases import run_samples_at, schedule_samples
    from recipes.config.rampup import ramp_schedule

    ramp = ramp_schedule(cfg)
    if ramp is None:
        return []
    seq, s = cfg.model.seq_length, schedule_samples(cfg)
    args = ["--step-batch-size-schedule", " ".join(f"{t * seq}:{b}" for t, b in ramp),
            # the held-out batches are full ones (Megatron-LM's default: micro-batch x DP)
            "--eval-global-batch-size", str(cfg.train.global_batch_size),
            "--train-samples", str(run_samples_at(cfg, cfg.train.train_iters)),
            "--lr-warmup-samples", str(s.warmup)]
    if cfg.scheduler.decay_iters is not None:
        args += ["--lr-decay-samples", str(s.decay)]
    if cfg.scheduler.style == "wsd" or cfg.scheduler.wsd_decay_iters is not None:
        args += ["--lr-wsd-decay-samples", str(s.wsd_decay)]
    return args


def step_schedule(text: str, seq_length: int | None) -> tuple[tuple[int, int], ...]:
    """`--step-batch-size-schedule` as Megatron Core reads it, (samples, batch) pairs
    (`StepBatchsizeNumMicroBatchesCalculator._parse_schedule`, without importing torch):
    "THRESHOLD:BATCH" words, a K/M/B/T suffix, thresholds in tokens when there is a length."""
    scale = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

    def number(word: str) -> int:
        word = word.strip().upper()
        factor = scale.get(word[-1:], 1)
        return int(float(word[:-1] if factor > 1 else word) * factor)

    pairs = []
    for entry in text.strip().replace(",", " ").split():
        threshold, batch = (number(part) for part in entry.split(":", 1))
        pairs.append((threshold // seq_length if seq_length else threshold, batch))
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


def _steps_to(schedule: tuple[tuple[int, int], ...], samples: int) -> int:
    """The steps Megatron-LM trains to reach `samples` (`training.py` `update_train_iters`: it
    steps until the consumed samples reach them)."""
    from recipes.config.rampup import samples_after

    low, high = 0, samples // min(b for _, b in schedule) + 1
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if samples_after(schedule, middle) < samples else (
            low, middle)
    return low


def _as_ramp(schedule: tuple[tuple[int, int], ...]) -> list[int] | None:
    """[start, increment, samples] whose ramp is `schedule`, or None when none is."""
    from types import SimpleNamespace

    from recipes.config.rampup import ramp_schedule

    start, increment = schedule[0][1], schedule[1][1] - schedule[0][1]
    ramp = [start, increment, schedule[-1][0]]
    train = SimpleNamespace(rampup_batch_size=ramp, global_batch_size=schedule[-1][1])
    if increment < 1 or ramp_schedule(SimpleNamespace(train=train)) != schedule:
        return None
    return ramp


def _ramp_from(a: Mapping[str, Any]) -> dict[str, Any]:
    """A step schedule back to the ramp, and a sample-based length and schedule back to steps;
    every mix Megatron-LM 0.19.2 refuses or trains otherwise is refused in one line."""
    from plugins.protocol.errors import ConfigError
    from recipes.config.phases import wsd_decay_iters
    from recipes.config.rampup import megatron_schedule
    from recipes.config.schema import SchedulerConfig

    text, samples, batch = a["step_batch_size_schedule"], a["train_samples"], a["global_batch_size"]
    problem = None
    if a["rampup_batch_size"] is not None:
        problem = (f"--rampup-batch-size {' '.join(map(str, a['rampup_batch_size']))} is ignored "
                   "by Megatron-LM 0.19.2 (Megatron Core deprecated it: the run trains a "
                   "constant --global-batch-size); for a ramp give --step-batch-size-schedule "
                   "with --train-samples (print=megatron_args writes both), or remove it")
    elif text is not None and batch is not None:
        problem = ("--step-batch-size-schedule with --global-batch-size: Megatron-LM refuses both "
                   "(the schedule's last batch is the full one); remove --global-batch-size")
    elif samples is not None and a["train_iters"] is not None:
        problem = "--train-samples with --train-iters: Megatron-LM takes one; remove the other"
    elif text is not None and samples is None:
        problem = ("--step-batch-size-schedule without --train-samples: with --train-iters "
                   "Megatron-LM counts the learning-rate schedule in steps of micro-batch x DP "
                   "samples; give --train-samples and --lr-warmup-samples / --lr-decay-samples")
    elif samples is not None and text is None and batch is None:
        problem = "--train-samples without --global-batch-size; give the global batch"
    if problem:
        raise ConfigError(problem)
    if samples is None:  # steps of one global batch: the flags in FLAGS carry them
        schedule, ramp = (((0, batch),) if batch else None), None
    else:
        schedule = ((0, batch),) if text is None else step_schedule(text, a["seq_length"])
        ramp = _as_ramp(schedule) if len(schedule) > 1 else None
        if len(schedule) > 1 and ramp is None:
            raise ConfigError(f"--step-batch-size-schedule '{text}' is not a linear ramp-up "
                              f"('{megatron_schedule(schedule)}' in samples): the project trains "
                              "train.rampup_batch_size=[start, increment, samples] only, equal "
                              "increments at equal shares of the ramp's samples")
    full = schedule[-1][1] if schedule else None
    if a["eval_global_batch_size"] not in (None, full):
        raise ConfigError(f"--eval-global-batch-size {a['eval_global_batch_size']}: the project "
                          f"evaluates full global batches ({full}); remove it")
    if samples is None:
        return {"train.rampup_batch_size": None}
    steps = _steps_to(schedule, samples)
    decay = None if a["lr_decay_samples"] is None else _steps_to(schedule, a["lr_decay_samples"])
    found = {"train.rampup_batch_size": ramp, "train.global_batch_size": full,
             "train.train_iters": steps, "scheduler.decay_iters": decay,
             "scheduler.warmup_iters": _steps_to(schedule, a["lr_warmup_samples"] or 0),
             "scheduler.wsd_decay_iters": None}
    if a["lr_wsd_decay_samples"] is not None:
        end, end_samples = decay or steps, a["lr_decay_samples"] or samples
        given = end - _steps_to(schedule, end_samples - a["lr_wsd_decay_samples"])
        default = wsd_decay_iters(SchedulerConfig(decay_iters=decay), steps)
        found["scheduler.wsd_decay_iters"] = None if given == default else given
    return found


def _pattern_args(cfg: Any) -> list[str]:
    pattern = cfg.model.hybrid_layer_pattern
    return [] if pattern is None else ["--hybrid-layer-pattern", pattern]


def _pattern_from(a: Mapping[str, Any]) -> dict[str, Any]:
    """`--hybrid-layer-pattern`, or the older spelling `--hybrid-override-pattern` (Megatron-LM
    reads it as the same pattern, `training/arguments.py:719-731`)."""
    return {"model.hybrid_layer_pattern": a["hybrid_layer_pattern"]
            or a["hybrid_override_pattern"]}


def _router_dtype_args(cfg: Any) -> list[str]:
    return ["--moe-router-dtype", "fp32"] if cfg.model.moe_router_fp32 else []


def _router_dtype_from(a: Mapping[str, Any]) -> dict[str, Any]:
    if a["moe_router_dtype"] == "fp64":
        from plugins.protocol.errors import ConfigError

        raise ConfigError("--moe-router-dtype fp64 is not one the project trains (the router "
                          "runs in fp32 with model.moe_router_fp32=true, else in the model's "
                          "dtype); use --moe-router-dtype fp32 or leave it out")
    return {"model.moe_router_fp32": a["moe_router_dtype"] == "fp32"}


def _flex_args(cfg: Any) -> list[str]:
    return ["--moe-flex-dispatcher-backend", cfg.model.moe_flex_backend]


def _flex_from(a: Mapping[str, Any]) -> dict[str, Any]:
    backend = a["moe_flex_dispatcher_backend"]
    if backend not in ("deepep", "hybridep"):
        from plugins.protocol.errors import ConfigError

        raise ConfigError(f"--moe-flex-dispatcher-backend {backend} drops tokens over a rank "
                          "capacity, which the project does not train; use deepep or hybridep")
    return {"model.moe_flex_backend": backend}


def _activation_offload_args(cfg: Any) -> list[str]:
    modules = cfg.train.offload_modules
    return ["--fine-grained-activation-offloading", "--offload-modules", *modules] if modules \
        else []


def _activation_offload_from(a: Mapping[str, Any]) -> dict[str, Any]:
    on = a["fine_grained_activation_offloading"]
    return {"train.offload_modules": list(a["offload_modules"] or []) if on else []}


def _graphs_args(cfg: Any) -> list[str]:
    """CUDA graphs, with TE's RNG tracker the graphed layers draw from (Megatron-LM turns it
    on itself, `training/arguments.py:1873-1879`; written so the line says it)."""
    t = cfg.train
    if t.cuda_graphs == "none":
        return []
    modules = ["--cuda-graph-modules", *t.cuda_graph_modules] if t.cuda_graph_modules else []
    return ["--cuda-graph-impl", t.cuda_graphs, *modules, "--cuda-graph-warmup-steps",
            str(t.cuda_graph_warmup_steps), "--te-rng-tracker"]


def _graphs_from(a: Mapping[str, Any]) -> dict[str, Any]:
    impl = a["cuda_graph_impl"]
    if impl == "full_iteration":
        from plugins.protocol.errors import ConfigError

        raise ConfigError("--cuda-graph-impl full_iteration graphs the whole step, which this "
                          "trainer does not capture; use transformer_engine or local")
    # Megatron-LM's parser turns each module name into its CudaGraphModule; its deprecated
    # `full` is the whole layer, an empty list (training/arguments.py:262-273).
    modules = [getattr(m, "name", m) for m in a["cuda_graph_modules"] or []]
    modules = [] if "full" in modules else modules
    return {"train.cuda_graphs": impl, "train.cuda_graph_modules": modules,
            "train.cuda_graph_warmup_steps": a["cuda_graph_warmup_steps"]}


SPELLED: tuple[Spelled, ...] = (
    Spelled(("model.activation",), ("swiglu", "squared_relu"), _activation_args,
            _activation_from),
    Spelled(("model.num_query_groups",), ("group_query_attention", "num_query_groups"),
            _groups_args, _groups_from),
    Spelled(("model.rope_scaling_factor",), ("use_rope_scaling", "rope_scaling_factor"),
            _rope_args, _rope_from, when=_rope),
    Spelled(("model.share_embeddings_and_output_weights",),
            ("untie_embeddings_and_output_weights",), _tied_args, _tied_from),
    Spelled(("model.transformer_impl",), ("transformer_impl",), _impl_args, _impl_from),
    Spelled(("precision.dtype",), ("bf16", "fp16"), _precision_args, _precision_from),
    Spelled(("train.recompute", "train.recompute_num_layers", "train.recompute_modules"),
            ("recompute_granularity", "recompute_method", "recompute_num_layers",
             "recompute_activations", "recompute_modules"), _recompute_args, _recompute_from),
    Spelled(("train.manual_gc_interval",), ("manual_gc", "manual_gc_interval"), _gc_args,
            _gc_from),
    Spelled(("scheduler.style",), ("lr_decay_style",), _style_args, _style_from),
    Spelled(("scheduler.wsd_decay_iters",), ("lr_wsd_decay_iters",), _wsd_args, _wsd_from),
    Spelled((), tuple(dest for _, dest, _ in ALWAYS_ON), _always_args, _always_from),
    Spelled(("data.source",), ("mock_data", "tokenizer_type",
                               "max_position_embeddings"), _data_args, _data_from),
    Spelled(("checkpoint.optimizer_format",), ("dist_ckpt_optim_fully_reshardable",),
            _format_args, _format_from),
    Spelled(("optimizer.distributed",), ("use_distributed_optimizer", "use_megatron_fsdp"),
            _distributed_args, _distributed_from),
    Spelled(("optimizer.fsdp",), ("use_megatron_fsdp", "data_parallel_sharding_strategy",
                                  "ckpt_format"), _fsdp_args, _fsdp_from),
    Spelled(("optimizer.cpu_offload", "optimizer.offload_fraction"),
            ("optimizer_cpu_offload", "optimizer_offload_fraction",
             "use_precision_aware_optimizer"), _optimizer_offload_args, _optimizer_offload_from),
    Spelled(("checkpoint.async_save",), ("async_save", "use_persistent_ckpt_worker"),
            _async_args, _async_from),
    Spelled(("model.hybrid_layer_pattern",), ("hybrid_layer_pattern", "hybrid_override_pattern"),
            _pattern_args, _pattern_from),
    Spelled(("model.moe_router_fp32",), ("moe_router_dtype",), _router_dtype_args,
            _router_dtype_from, when=_moe),
    Spelled(("model.moe_flex_backend",), ("moe_flex_dispatcher_backend",), _flex_args,
            _flex_from, when=_flex),
    Spelled(("train.offload_modules",), ("fine_grained_activation_offloading",
                                         "offload_modules"), _activation_offload_args,
            _activation_offload_from),
    Spelled(("train.cuda_graphs", "train.cuda_graph_modules", "train.cuda_graph_warmup_steps"),
            ("cuda_graph_impl", "cuda_graph_modules", "cuda_graph_warmup_steps",
             "te_rng_tracker"), _graphs_args, _graphs_from),
    # After the WSD anneal's entry: under a ramp-up the schedule is read from samples.
    Spelled(("train.rampup_batch_size",), ("rampup_batch_size", "step_batch_size_schedule",
                                           "train_samples", "lr_warmup_samples",
                                           "lr_decay_samples", "lr_wsd_decay_samples",
                                           "eval_global_batch_size"), _ramp_args, _ramp_from),
)

# Megatron-LM flags that say where things are or how a run reports, not what it trains: read
# and named ("not carried") but neither refused nor turned into config fields.
ENVIRONMENT_DESTS = frozenset({
    "save", "data_path", "split", "tokenizer_model", "tensorboard_dir", "wandb_project",
    "wandb_exp_name", "wandb_save_dir", "log_throughput", "log_timers_to_tensorboard",
    "log_validation_ppl_to_tensorboard", "log_memory_to_tensorboard", "timing_log_level",
    "tensorboard_log_interval", "log_params_norm", "log_num_zeros_in_grad", "vocab_file",
    "merge_file", "data_cache_path", "num_workers",
    "use_mcore_models", "deprecated_use_mcore_models", "no_load_optim", "no_load_rng",
    "exit_duration_in_mins", "exit_interval", "use_flash_attn", "attention_backend",
    "no_masked_softmax_fusion", "masked_softmax_fusion", "bias_gelu_fusion",
    "bias_swiglu_fusion", "bias_dropout_fusion", "apply_rope_fusion",
    "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
    "use_cpu_initialization",
})


def _field_names(section: Any, prefix: str) -> list[str]:
    return [f"{prefix}.{f.name}" for f in dataclasses.fields(section)]


def no_flag_fields(cfg: Any) -> list[str]:
    """Config fields no Megatron-LM flag carries (besides the world size, which torchrun
    gives): the rest of what our recipe says, listed beside the command line."""
    carried = {f.field for f in FLAGS} | {name for s in SPELLED for name in s.fields}
    if cfg.data.source != "synthetic":  # the corpus or a blend's prefixes: paths, not a flag
        carried.discard("data.source")
    found = []
    for section in ("model", "parallel", "cluster", "train", "optimizer", "scheduler",
                    "precision", "data", "checkpoint", "logging"):
        found += [n for n in _field_names(getattr(cfg, section), section) if n not in carried]
    return found + ["plugins.* (but what a plugin writes as flags)", "name", "output_dir",
                    "run_dir", "dry_run"]


def _get(cfg: Any, dotted: str) -> Any:
    value = cfg
    for name in dotted.split("."):  # 'section.name', or 'plugins.<plugin>.name'
        value = getattr(value, name)
    return value


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def to_megatron_args(cfg: Any) -> list[str]:
    """The `pretrain_gpt.py` (`pretrain_hybrid.py`) arguments that train what `cfg` trains
    (every carried field)."""
    args: list[str] = []
    for f in FLAGS:
        value = _get(cfg, f.field)
        if not _applies(f.when, cfg):
            continue
        if f.kind == ON:
            args += [f.flag] if value else []
        elif f.kind == OFF:
            args += [] if value else [f.flag]
        elif value is not None:
            args += [f.flag, _text(value)]
    for spelled in SPELLED:
        args += spelled.to_args(cfg) if _applies(spelled.when, cfg) else []
    for _, config in cfg.plugins.configs():  # a plugin's own flags (FP8's), when it is on
        args += config.megatron_lm_args()
    return args


def from_megatron_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Config fields ('section.name' -> value) from Megatron-LM's parsed arguments (its
    `argparse.Namespace` as a mapping, with '__given__': the dests typed on the command line).
    An entry whose `when` fails on the fields read, and none of whose flags is typed, is left
    out: the project's default stands, not Megatron-LM's (a dense line's dispatcher)."""
    given = values.get("__given__", frozenset())
    parts = [(f.when, (f.dest,), {f.field: values[f.dest]}) for f in FLAGS]
    parts += [(s.when, s.dests, s.from_args(values)) for s in SPELLED]
    read = _as_config({field: value for _, _, part in parts for field, value in part.items()})
    found: dict[str, Any] = {}
    for when, dests, part in parts:
        if _applies(when, read) or not given.isdisjoint(dests):
            found.update(part)
    for name, config in PluginsConfig().configs():
        found.update({f"plugins.{name}.{key}": value
                      for key, value in config.from_megatron_lm(values).items()})
    if _inert_wsd_style(values, found):
        del found["scheduler.wsd_decay_style"]
    return found


def _applies(when: Callable[[Any], bool] | None, cfg: Any) -> bool:
    return when is None or when(cfg)


def _as_config(fields: Mapping[str, Any]) -> Any:
    """Fields read ('section.name' -> value) as the sections a `when` condition reads
    (`cfg.model.num_moe_experts`)."""
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in fields.items():
        section, name = dotted.split(".", 1)
        sections.setdefault(section, {})[name] = value
    return SimpleNamespace(**{name: SimpleNamespace(**v) for name, v in sections.items()})


def _inert_wsd_style(values: Mapping[str, Any], found: Mapping[str, Any]) -> bool:
    """A line that types no `--lr-wsd-decay-style` and trains no WSD schedule gets Megatron-LM's
    default shape (exponential), which shapes nothing there: read as unset (the project's
    default), not as a setting the validation would refuse as doing nothing."""
    return ("lr_wsd_decay_style" not in values.get("__given__", ())
            and found.get("scheduler.style") != "wsd")


def carried_dests() -> frozenset[str]:
    """Every Megatron-LM argument this table reads."""
    plugins = {d for _, config in PluginsConfig().configs() for d in config.megatron_lm_dests()}
    return frozenset({f.dest for f in FLAGS} | {d for s in SPELLED for d in s.dests} | plugins)


# The Mamba mixer's arguments no Megatron-LM flag carries: its hybrid spec leaves them at
# `MambaMixer.__init__`'s defaults (`ssm/mamba_mixer.py:177, 192`); this project's stack spec
# passes the recipe's values as the mixer's params (`trainer/models/hybrid/spec.py`).
MIXER_DEFAULTS = {"model.mamba_conv_kernel": 4, "model.mamba_chunk_size": 128}


def script_name(cfg: Any) -> str:
    """Megatron-LM's entry script for the model: `pretrain_hybrid.py` builds a HybridModel from
    `--hybrid-layer-pattern`, `pretrain_gpt.py` a GPTModel."""
    return "pretrain_hybrid.py" if _hybrid(cfg) else "pretrain_gpt.py"


def mixer_note(cfg: Any) -> str | None:
    """For a hybrid whose mixer differs from Megatron-LM's: what the line cannot say, and how a
    spec says it (None: Megatron-LM's defaults are the recipe's)."""
    if not _hybrid(cfg):
        return None
    differ = [f"{name}={_get(cfg, name)} (Megatron-LM: {default})"
              for name, default in MIXER_DEFAULTS.items() if _get(cfg, name) != default]
    if not differ:
        return None
    return ("# the Mamba mixer's conv width and chunk size have no flag, and Megatron-LM's "
            f"hybrid spec builds the mixer with its defaults; this recipe has {', '.join(differ)}"
            ": give --spec a stack spec whose mixer params set d_conv and chunk_size (the "
            "chunk size changes rounding only, the conv width the weights' shape)")


def phases_refusal(cfg: Any) -> str | None:
    """Megatron-LM has no phases: one line of a phased run would train its first phase's blend,
    batch and layout for the whole run. None without phases; else the line that says so, names
    the phases and how to print one phase as a run of its own (`phases=[]` and its values)."""
    import shlex

    from recipes.config.phases import phase_spans, relaunch_overrides

    if not cfg.phases:
        return None
    spans = phase_spans(cfg)

    def described(span: Any) -> str:
        values = [f"blend {span.blend}" if span.blend != cfg.data.blend else "",
                  f"batch {span.global_batch_size}"
                  if span.global_batch_size != cfg.train.global_batch_size else "",
                  f"sequence {span.seq_length}" if span.seq_length != cfg.model.seq_length
                  else "", f"CP{span.context}" if span.context != cfg.parallel.context else "",
                  "the WSD decay" if span.lr_decay else "", "a new launch" if span.relaunch
                  else ""]
        return f"{span.name} (steps {span.start_step}-{span.end_step}" + "".join(
            f", {v}" for v in values if v) + ")"

    last = spans[-1]
    example = ["phases=[]", *([f"data.blend={last.blend}"] if last.blend else []),
               f"train.global_batch_size={last.global_batch_size}", *relaunch_overrides(last)]
    return (f"phases: Megatron-LM has no phases, and one command line would train the first "
            f"phase's blend, batch and layout for all {cfg.train.train_iters} steps; this run "
            f"has {', '.join(described(s) for s in spans)}. To print one phase as a run of its "
            "own (its own schedule from step 0, no resume), add phases=[] and its values, e.g. "
            f"for {last.name}: {' '.join(shlex.quote(o) for o in example)}")


MEGATRON_ARGS_NAME = "megatron_args"  # the name of a config read from a Megatron-LM line


def torchrun_line(cfg: Any) -> str:
    """The torchrun line that trains `cfg` with Megatron-LM (the world size is torchrun's)."""
    import shlex

    c = cfg.cluster
    words = [f"--nnodes={c.nodes}", f"--nproc-per-node={c.gpus_per_node}", script_name(cfg),
             *to_megatron_args(cfg)]
    return "torchrun " + " ".join(shlex.quote(w) for w in words)


def command_text(cfg: Any) -> str:
    """What `scripts/pretrain.py print=megatron_args` prints: the torchrun line that trains
    `cfg` with Megatron-LM, then the fields no flag carries. A phased run is refused
    (`phases_refusal`): Megatron-LM would train something else."""
    from plugins.protocol.errors import ConfigError

    refusal = phases_refusal(cfg)
    if refusal:
        raise ConfigError(refusal)
    c = cfg.cluster
    note = mixer_note(cfg)
    return "\n".join([
        f"# Megatron-LM trains {cfg.name} with (world size {c.nodes * c.gpus_per_node}: "
        "torchrun's, not a flag):",
        torchrun_line(cfg),
        *([note] if note else []),
        "# no Megatron-LM flag for (the project's own settings): "
        + ", ".join(no_flag_fields(cfg))])
