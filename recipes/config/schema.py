"""Typed run configuration: one small dataclass per concern.

Every field has a default and a one-line doc (the comment after it); `RunConfig` composes them.
Nothing here imports torch or Megatron, so a configuration can be resolved and validated
before any heavy import or process group exists. Plugin sections come from the plugins' own
config classes, composed in `plugins/registry.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from plugins.registry import PluginsConfig
from recipes.config.layout import Layout


@dataclass(kw_only=True)
class ModelConfig:
    """Shape of the model (Megatron Core `TransformerConfig` + `GPTModel` / `HybridModel`
    fields): a GPT model, or a hybrid Mamba-Transformer one when `hybrid_layer_pattern` is set."""

    num_layers: int = 4  # transformer layers in the whole model
    hidden_size: int = 64  # model width
    ffn_hidden_size: int = 256  # MLP inner width (per expert for MoE unless moe_ffn_hidden_size)
    num_attention_heads: int = 4  # query heads
    num_query_groups: int | None = None  # KV heads for GQA; None = same as attention heads
    kv_channels: int | None = None  # per-head width; None = hidden_size / heads
    seq_length: int = 64  # tokens per sample
    vocab_size: int = 256  # tokenizer vocabulary (padded to make_vocab_size_divisible_by x TP)
    make_vocab_size_divisible_by: int = 128  # Megatron's vocab padding unit (before x TP)
    activation: Literal["gelu", "swiglu", "squared_relu"] = "gelu"  # MLP non-linearity
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"  # norm layer type
    # LayerNorm1p: each norm stores its gamma minus one, so weight decay pulls the scale towards
    # 1, not 0 (Megatron's layernorm_zero_centered_gamma, Megatron-LM's --apply-layernorm-1p;
    # Nemotron-4). Transformer Engine's norms only.
    layernorm_zero_centered_gamma: bool = False
    position_embedding: Literal["rope", "learned_absolute", "none"] = "rope"  # position encoding
    rotary_base: int = 10000  # RoPE theta
    # Share of each attention head's channels RoPE rotates, the rest pass unrotated (Megatron's
    # rotary_percent; Nemotron-4: 0.5).
    rotary_percent: float = 1.0
    rope_scaling_factor: float | None = None  # Llama 3.1 RoPE scaling (8.0); None = no scaling
    add_bias_linear: bool = True  # biases in linear layers (MoE models need False)
    share_embeddings_and_output_weights: bool = True  # tie input embedding and output layer
    hidden_dropout: float = 0.0  # dropout after attention / MLP
    attention_dropout: float = 0.0  # dropout on attention probabilities
    # Attention scores masked and normalised in fp32 in a bf16/fp16 run (Megatron Core's
    # attention_softmax_in_fp32, Megatron-LM's --attention-softmax-in-fp32); false keeps them in
    # the run's precision, as Megatron Bridge's Nemotron-H models do. True is this project's
    # default (Megatron Core's too). Megatron Core's local attention reads it; Transformer
    # Engine's is not given it.
    attention_softmax_in_fp32: bool = True
    init_method_std: float = 0.02  # std of the normal weight init
    # Whose layers: auto = Transformer Engine's on GPU ranks (fused attention and kernels, FP8,
    # packed THD; refused before launch when TE is missing), Megatron Core's local ones on CPU
    # ranks; local = the local layers on GPUs too (unfused attention, no FP8 or THD);
    # transformer_engine = TE's, or refused.
    transformer_impl: Literal["auto", "transformer_engine", "local"] = "auto"
    # Transformer Engine's layers only: each linear adds its weight gradient into the fp32 main
    # gradient inside the GEMM (Megatron's default, on); false keeps a separate add, as
    # Megatron Bridge's Llama 3 8B FSDP performance configuration does.
    gradient_accumulation_fusion: bool = True
    # Mixture of experts (None = dense model).
    num_moe_experts: int | None = None  # experts per MoE layer
    moe_router_topk: int = 2  # experts each token is routed to
    moe_ffn_hidden_size: int | None = None  # expert MLP width; None = ffn_hidden_size
    # Token exchange: all-to-all, all-gather, or flex (DeepEP / HybridEP kernels, GPU only).
    moe_token_dispatcher: Literal["alltoall", "allgather", "flex"] = "alltoall"
    moe_aux_loss_coeff: float = 0.0  # load-balancing loss weight
    # The load-balancing loss (when its coefficient is > 0): over the whole micro-batch
    # (aux_loss) or per sequence (seq_aux_loss, DeepSeek-V3 and Nemotron 3).
    moe_load_balancing: Literal["aux_loss", "seq_aux_loss"] = "aux_loss"
    moe_router_score_function: Literal["softmax", "sigmoid"] = "softmax"  # routing scores
    # Auxiliary-loss-free balancing: a per-expert bias added to the scores for the top-k choice
    # only, moved after every step towards equal load (needs sigmoid scores).
    moe_router_expert_bias: bool = False
    moe_router_bias_update_rate: float = 1e-3  # step of that bias update
    moe_router_topk_scaling_factor: float | None = None  # scale of the top-k weights; None = 1
    moe_router_fp32: bool = False  # routing and the weighted sum of expert outputs in fp32
    moe_shared_expert_ffn_hidden_size: int | None = None  # shared experts' width; None = none
    # GPU fast paths of the MoE layer (Transformer Engine's layers; CPU ranks run without them
    # and the plan line says so; docs/fast-paths.md). The flex dispatcher's library: DeepEP's
    # all-to-all kernels, or its HybridEP ones (NVLink domains beyond a node). Megatron's third,
    # ncclep, drops tokens over a rank capacity: not offered.
    moe_flex_backend: Literal["deepep", "hybridep"] = "deepep"
    moe_grouped_gemm: bool = False  # every local expert's GEMM in one grouped kernel (TE)
    moe_permute_fusion: bool = False  # token permute/unpermute in fused TE kernels
    moe_router_fusion: bool = False  # top-k routing and the aux loss in one TE kernel
    moe_shared_expert_overlap: bool = False  # shared experts run beside the token exchange
    # Squared ReLU weighted by the routing probability in one kernel (grouped GEMM experts).
    moe_fused_squared_relu: bool = False
    # Latent MoE (Nemotron 3 Super): the routed experts work in this width; each MoE layer
    # projects its tokens from hidden_size down to it before dispatch and back up after the
    # combine (the router and shared experts stay at hidden_size). None = no latent projection.
    moe_latent_size: int | None = None
    # Hybrid Mamba-Transformer (Megatron Core's HybridModel); None = a GPT model. One symbol
    # per layer: M Mamba2 mixer, * self-attention, - MLP, E MoE; | cuts pipeline stages; each
    # part after / is one multi-token-prediction depth.
    hybrid_layer_pattern: str | None = None
    mamba_state_dim: int = 128  # SSM state size per group (d_state)
    mamba_head_dim: int = 64  # channels of one Mamba head
    mamba_num_heads: int | None = None  # Mamba heads; None = 2 x hidden_size / mamba_head_dim
    mamba_num_groups: int = 8  # groups of heads sharing one B and C projection
    mamba_conv_kernel: int = 4  # width of the causal depthwise convolution (d_conv)
    mamba_chunk_size: int = 128  # chunk length of the SSD scan
    # Multi-token prediction: the depths are the pattern's parts after '/' (M*ME/*E/*E: two);
    # the MTP loss is their mean times this factor, added to the LM loss (Megatron's default 0.1)
    mtp_loss_scaling_factor: float = 0.1
    mtp_use_repeated_layer: bool = False  # one MTP layer's weights run at every depth

    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_layer_pattern is not None


def uses_transformer_engine(impl: str, on_gpu: bool) -> bool:
    """Whether `model.transformer_impl` builds Transformer Engine's layers on these ranks."""
    return impl == "transformer_engine" or (impl == "auto" and on_gpu)


@dataclass(kw_only=True)
class ParallelConfig:
    """How the model is split. Data parallel size is derived: world / (TP x PP x CP)."""

    tensor: int = 1  # tensor model parallel size (TP)
    pipeline: int = 1  # pipeline model parallel size (PP)
    virtual_pipeline: int | None = None  # model chunks per pipeline rank (interleaved 1F1B)
    context: int = 1  # context parallel size (CP): sequence split across ranks
    expert: int = 1  # expert model parallel size (EP)
    expert_tensor: int | None = None  # TP size inside experts; None = same as tensor
    sequence_parallel: bool = False  # shard norm/dropout activations over the TP group
    # Uneven pipeline (Megatron's num_layers_in_first/last_pipeline_stage): layers on the first
    # and last stage; the middle stages share the rest evenly. None = an even split.
    first_stage_layers: int | None = None  # layers on the first stage; None = even split
    last_stage_layers: int | None = None  # layers on the last stage; None = even split
    # Pipeline point-to-point options; interleaving needs overlap on and batching off.
    overlap_p2p_comm: bool = True  # overlap pipeline sends/receives with compute
    batch_p2p_comm: bool = False  # batch pipeline sends/receives (wrong with interleaving)
    # Overlap TP's all-gathers and reduce-scatters with the GEMMs beside them (Transformer
    # Engine's userbuffers; needs sequence parallel); GPU only.
    tp_comm_overlap: bool = False
    # Overlap the expert token exchange of one micro-batch with another's compute (Megatron's
    # overlap_moe_expert_parallel_comm, a 1F1B schedule of two micro-batches); GPU only.
    ep_comm_overlap: bool = False


@dataclass(kw_only=True)
class ClusterConfig:
    """Where the run executes: the world size comes from here."""

    nodes: int = 1  # machines
    gpus_per_node: int = 4  # ranks per machine (local CPU processes when there is no GPU)
    gpu_memory_gib: float = 80.0  # memory of one accelerator, for the planner
    # A conf/cluster/*.yaml file describing the machines: its peak TFLOP/s per precision gives
    # the run's MFU (None: MFU is reported as unknown, not guessed).
    spec: str | None = None
    # Where ranks compute: gpu, cpu (Megatron Core over gloo through the CPU runtime; a cluster
    # file's `device: cpu` sets it), or auto = on CPU exactly when there is no CUDA device (on a
    # single node: a GPU node of a multi-node run without GPUs is refused, not run on CPU).
    device: Literal["auto", "gpu", "cpu"] = "auto"
    threads_per_rank: int = 1  # torch intra-op threads per CPU rank (OMP_NUM_THREADS)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(kw_only=True)
class TrainConfig:
    """Batch sizes, length of the run and what is recomputed."""

    micro_batch_size: int = 2  # samples per rank per forward pass
    global_batch_size: int = 8  # samples per optimizer step over all DP ranks
    # Batch ramp-up, Megatron-LM's --rampup-batch-size: [start, increment, samples] grows the
    # global batch from start by increment over the first `samples` samples (rampup.py).
    rampup_batch_size: list[int] | None = None
    train_iters: int = 100  # optimizer steps
    # Steps between held-out evaluations; one also runs where the launch starts and at its
    # last step (0 = only those two).
    eval_interval: int = 50
    eval_iters: int = 4  # global batches per held-out evaluation
    seed: int = 1234  # seed for init, dropout and data order
    recompute: Literal["none", "full", "selective"] = "none"  # activation recomputation
    recompute_num_layers: int = 1  # layers per recompute block (full recompute)
    # Selective recompute's modules (Megatron's recompute_modules): core_attn, layernorm, mlp,
    # moe, moe_act (docs/fast-paths.md); read only with recompute=selective.
    recompute_modules: list[str] = field(default_factory=lambda: ["core_attn"])
    # Activation offloading: the inputs of these modules go to host memory until the backward
    # (Megatron's fine-grained activation offloading; TE layers, GPU only): attn_norm,
    # qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act. Empty: off.
    offload_modules: list[str] = field(default_factory=list)
    # CUDA graphs: none, transformer_engine (TE's per-layer graphs, captured after
    # cuda_graph_warmup_steps steps) or local (Megatron's own); GPU only.
    cuda_graphs: Literal["none", "transformer_engine", "local"] = "none"
    # What of each layer is graphed: attn, mlp, moe, moe_router, moe_preprocess, mamba; empty =
    # the whole layer.
    cuda_graph_modules: list[str] = field(default_factory=list)
    cuda_graph_warmup_steps: int = 3  # eager steps before the graphs are captured
    exit_on_nonfinite: bool = True  # stop with one line when loss or grad norm is NaN/inf
    # Collective timeout (Megatron-LM's --distributed-timeout-minutes): how long a rank waits
    # in a collective for a rank that died or hangs before it stops.
    distributed_timeout_minutes: int = 10
    # The same, while the data's indexes are built (rank 0 builds them; the others wait in a
    # barrier): a large blend's first index build takes longer than a collective should.
    data_setup_timeout_minutes: int = 60
    # Python's garbage collector off, run every N steps instead (Megatron-LM's --manual-gc
    # --manual-gc-interval; Bridge's pretraining recipes use 100): an automatic collection
    # lands at a random step on each rank and the others wait for it in the next collective.
    # 0: automatic collection.
    manual_gc_interval: int = 0


@dataclass(kw_only=True)
class OptimizerConfig:
    """Adam with decoupled weight decay, through `megatron.core.optimizer`."""

    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # floor of the decay
    weight_decay: float = 0.01  # decoupled weight decay
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0  # global gradient-norm clip (0 = off)
    distributed: bool = False  # shard optimizer state over DP (ZeRO-1, distributed optimizer)
    overlap_grad_reduce: bool = False  # overlap DP gradient reduce with backward
    overlap_param_gather: bool = False  # overlap DP param all-gather (distributed optimizer)
    bucket_size: int | None = None  # DDP bucket size in elements; None = Megatron's default
    # Megatron FSDP (`use_megatron_fsdp`, `data_parallel_sharding_strategy` in
    # megatron.core.distributed): shard the optimizer state (optim, ZeRO-1), also gradients
    # (optim_grads, ZeRO-2) or also weights (optim_grads_params, ZeRO-3) over DP; needs the
    # distributed optimizer; checkpoints are fsdp_dtensor (docs/memory.md).
    fsdp: Literal["none", "optim", "optim_grads", "optim_grads_params"] = "none"
    # The FP32 master weights and Adam moments in CPU memory, stepped there by Megatron's
    # hybrid-device optimizer (`optimizer_cpu_offload`); needs the distributed optimizer and
    # bf16/fp16 weights. `offload_fraction`: the share of the state offloaded (the rest stays
    # on the GPU).
    cpu_offload: bool = False
    offload_fraction: float = 1.0
    # torch's FSDP2 through Megatron Core (`use_torch_fsdp2`): refused here with the reason
    # (recipes/config/sharding_rules.py); Megatron FSDP's optim_grads_params shards the same.
    torch_fsdp2: bool = False


@dataclass(kw_only=True)
class SchedulerConfig:
    """Learning-rate schedule (`OptimizerParamScheduler`)."""

    style: Literal["cosine", "wsd", "linear", "constant"] = "cosine"  # decay shape
    warmup_iters: int = 10  # linear warm-up steps
    decay_iters: int | None = None  # steps over which lr decays; None = train_iters
    wsd_decay_iters: int | None = None  # WSD only: final annealing steps; None = 10% of decay
    wsd_decay_style: Literal["linear", "cosine", "exponential", "minus_sqrt"] = "linear"


# fp16 loss scaling, as Megatron's OptimizerConfig names it (defaults: Megatron's own,
# megatron/core/optimizer/optimizer_config.py:216-230).
LOSS_SCALE_FIELDS = (
    "loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"
)


def _precision_default(name: str):
    return next(f.default for f in fields(PrecisionConfig) if f.name == name)


def check_loss_scale_positive(cfg: RunConfig) -> str | None:
    """Megatron asserts these (`optimizer/grad_scaler.py:19, 109-124`) only once ranks run."""
    for name in LOSS_SCALE_FIELDS:
        value = getattr(cfg.precision, name)
        if value is not None and value <= 0:
            example = _precision_default(name) or 65536
            return (
                f"precision.{name}={value:g} must be positive; set it, e.g. "
                f"precision.{name}={example:g}"
            )
    return None


def check_min_loss_scale(cfg: RunConfig) -> str | None:
    """Dynamic scaling starts at the initial scale and never goes below the minimum."""
    p = cfg.precision
    if p.min_loss_scale > p.initial_loss_scale:
        return (
            f"precision.min_loss_scale={p.min_loss_scale:g} is above "
            f"precision.initial_loss_scale={p.initial_loss_scale:g}; lower the minimum or "
            "raise the initial scale"
        )
    return None


def check_loss_scale_needs_fp16(cfg: RunConfig) -> str | None:
    """Loss scaling exists for fp16's narrow exponent range; bf16 and fp32 need none, and a
    static `loss_scale` would still scale their loss (`optimizer/__init__.py:649-650`)."""
    p = cfg.precision
    if p.dtype == "fp16":
        return None
    for name in LOSS_SCALE_FIELDS:
        value = getattr(p, name)
        if value != _precision_default(name):
            return (
                f"precision.{name}={value:g} only applies to fp16 training, but "
                f"precision.dtype={p.dtype}; set precision.dtype=fp16 or leave "
                f"precision.{name} at its default"
            )
    return None


@dataclass(kw_only=True)
class PrecisionConfig:
    """Number formats of parameters and compute, and fp16's loss scaling (Megatron's optimizer,
    DDP and Float16Module read these on every run; FP8 is the `plugins.fp8` plugin)."""

    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"  # parameter / compute dtype
    grad_reduce_in_fp32: bool = True  # keep DP gradient buffers in fp32
    # fp16 only: a step whose gradients overflow is skipped (lr unchanged) and counted.
    loss_scale: float | None = None  # static loss scale; None = dynamic loss scaling
    initial_loss_scale: float = 2.0**32  # dynamic: scale of the first step
    min_loss_scale: float = 1.0  # dynamic: floor of the scale
    loss_scale_window: int = 1000  # dynamic: overflow-free steps before the scale doubles
    hysteresis: int = 2  # dynamic: overflowing steps before the scale halves

    def rules(self) -> tuple:
        """This section's validation rules (pure functions of the whole run config)."""
        return (check_loss_scale_positive, check_min_loss_scale, check_loss_scale_needs_fp16)


@dataclass(kw_only=True)
class DataConfig:
    """Training text and tokenizer."""

    source: Literal["python_stdlib", "synthetic", "blend"] = "python_stdlib"  # what to train on
    blend: str | None = None  # source=blend: conf/data/<name>.yaml (prepared datasets, weights)
    # How documents share a sample (blend only): concatenate and cut (Megatron's default),
    # the same with attention kept inside documents, or exact packs (packed and inter_document
    # turn the packing plugin on).
    documents: Literal["concatenate", "inter_document", "packed"] = "concatenate"
    tokenizer: Literal["byte"] = "byte"  # in-memory sources: byte-level, no download, vocab 256
    max_corpus_bytes: int = 4_000_000  # cap on text read from the corpus
    heldout_fraction: float = 0.05  # share of the token stream kept for held-out loss
    eod_mask_loss: bool = True  # no loss where the input is end-of-document (Megatron's flag)
    # documents=packed: which source each row takes, by the blend's weights. `megatron`: the
    # rule of Megatron's blended dataset (its compiled build_blending_indices), a split held out
    # per source; `v1`: this project's first rule (row r weighed as r + 1, the order's last rows
    # held out), what runs saved before this field used.
    pack_order: Literal["megatron", "v1"] = "megatron"

    @property
    def packed_rows(self) -> bool:
        """Whether micro-batches are packed rows: prepared data (a blend) whose documents are
        kept apart, `documents=packed` (exact packs) or `inter_document` (Megatron's rows with
        per-document `cu_seqlens`); other sources with those modes are refused by the core data
        rule. The data source, the packing plugin and the machine check all ask this."""
        return self.source == "blend" and self.documents != "concatenate"


@dataclass(kw_only=True)
class CheckpointConfig:
    """Megatron distributed checkpoints (`torch_dist`)."""

    save: bool = True  # write a checkpoint at the end of the run
    save_interval: int = 0  # steps between checkpoints (0 = only at the end)
    load: str | None = None  # checkpoint directory to start from
    # Continue from the newest complete checkpoint in <run_dir>/checkpoints when there is one,
    # else start fresh (a requeued job resumes its run). Needs run_dir; not with `load`.
    resume: bool = False
    load_model_only: bool = False  # load weights only (fresh optimizer and step 0)
    # The distributed optimizer's state on disk (Megatron-LM's default): dp_reshardable writes
    # each rank's own shard (no gather; a resume may change DP only); fully_reshardable gathers
    # each TP x PP share's whole fp32 state on every rank first (any layout can resume it).
    # Megatron's fully_sharded_model_space (no gather) is not offered: Core 0.19.2 refuses to
    # save it (flattened_range, docs/checkpoints.md "Format").
    optimizer_format: Literal["fully_reshardable", "dp_reshardable"] = "dp_reshardable"
    keep_last: int | None = None  # keep the newest N saved steps (+ the resumed-from); None: all
    # Before launch, check the loaded checkpoint's files against its run.json: sizes and CRC-32
    # ("checksum", reads every byte once) or sizes only ("size", for very large checkpoints).
    verify: Literal["checksum", "size"] = "checksum"
    # Write checkpoints in the background with Megatron Core's asynchronous distributed save (a
    # forked writer per save; torch_dist, this trainer's only format, is the one Megatron saves
    # asynchronously): the step pays only for the state's copy; `latest` moves steps later,
    # once every rank's files are complete. Needs checkpoint.save=true.
    async_save: bool = False
    # The layout on disk: mcore_recipes (step_NNNNNNN, `latest`) or megatron_lm, the same files
    # under Megatron-LM's names (iter_NNNNNNN, latest_checkpointed_iteration.txt) with the
    # common state and RNG layout its load_checkpoint reads, so `pretrain_gpt.py --load` (or
    # pretrain_hybrid.py) resumes it too; both load here (docs/megatron-lm.md "Moving a run").
    format: Literal["mcore_recipes", "megatron_lm"] = "mcore_recipes"
    # When the run is stopped (Ctrl-C, SIGTERM: scancel, a requeue, the time limit), save and
    # publish a checkpoint of the last step finished before every rank ends; with it, SIGTERM
    # too waits for the step boundary (Ctrl-C always does). torch's launcher gives the ranks
    # TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (30) after the signal, Slurm KillWait.
    save_on_stop: bool = False


@dataclass(kw_only=True)
class LoggingConfig:
    """What the run prints and writes."""

    log_interval: int = 10  # steps between log lines
    progress_bar: bool = True  # rich progress bar on rank 0
    # Run the 2 steps after warm-up under torch.profiler to measure communication not hidden
    # behind compute (left out of tokens/s). Off by default: starting a profiler costs seconds
    # on CPU; the scaling harness turns it on.
    exposed_comm: bool = False


@dataclass(kw_only=True)
class PhaseConfig:
    """One phase of a run; a field left null keeps the run's own value."""

    name: str = "phase"  # its name in logs, the summary and the saved data positions
    tokens: float | None = None  # where it ends: its share of the run's tokens (shares add to 1)
    end_step: int | None = None  # or: the step it ends at (the last phase's is train.train_iters)
    blend: str | None = None  # its blend file (data.source=blend); null = data.blend
    global_batch_size: int | None = None  # its global batch; null = train.global_batch_size
    seq_length: int | None = None  # its sequence length (relaunch); null = model.seq_length
    context: int | None = None  # its context-parallel size (relaunch); null = parallel.context
    # How its documents share a row (relaunch; null = data.documents): `packed` rows of whole
    # documents, each attending to itself only, e.g. long rows of mixed document lengths.
    documents: Literal["concatenate", "inter_document", "packed"] | None = None
    micro_batch_size: int | None = None  # its micro-batch (relaunch); null = train.micro_batch_size
    lr_decay: bool = False  # the WSD schedule's decay runs over this phase (scheduler.style=wsd)
    relaunch: bool = False  # start it as a new launch from the previous phase's last checkpoint


@dataclass(kw_only=True)
class RunConfig:
    """Everything one training run needs."""

    name: str = "tiny"  # recipe name this configuration came from
    output_dir: str = "runs"  # runs are written to <output_dir>/<name>-<timestamp>
    run_dir: str | None = None  # explicit run directory (overrides output_dir naming)
    dry_run: bool = False  # build every distinct rank on the meta device and report, no training
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    plugins: PluginsConfig = field(default_factory=PluginsConfig)
    # The run in phases (recipes/config/phases.py): where each ends, its blend, batch, sequence,
    # CP and whether the schedule decays over it. Empty: one phase, the run's own values.
    phases: list[PhaseConfig] = field(default_factory=list)

    @property
    def layout(self) -> Layout:
        """Parallel degrees, derived sizes, groups and placement of this run."""
        return Layout.from_config(self)

