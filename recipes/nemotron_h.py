"""Hybrid Mamba-Transformer recipes on Megatron Core's HybridModel: Nemotron-H 4B/8B/47B/56B,
Nemotron Nano v2 9B/12B (12B also in its reported phases: a data curriculum, WSD's decay,
a 512k long-context phase), Nemotron 3 Nano 30B-A3B (also in its reported phases), and tiny
hybrids for CPU ranks.

Shapes are Megatron Bridge's `nemotronh` providers; the layouts its pretraining recipes use.
Every family member is `nemotron_h_model` plus its own sizes and pattern; every large recipe is
`large_run_base` plus its layout, batch and schedule. The tiny hybrids share one model with all
four layer kinds (Mamba2, attention, MLP, MoE routed the Nemotron 3 way) and one batch, so
their losses are comparable layout to layout; `hybrid_tiny_dp1` is the one-rank reference.
"""

from __future__ import annotations

from recipes.base_64gpu import large_run_base
from recipes.config.phases import PhaseConfig
from recipes.config.schema import ModelConfig, ParallelConfig, RunConfig
from recipes.models.hybrid.pattern import layer_symbols
from recipes.tiny import tiny_base

NEMOTRON_H_VOCAB = 131_072
# Nemotron-H 4B and 8B share one 52-layer pattern.
NEMOTRON_H_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NEMOTRON_H_47B_PATTERN = ("M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-"
                          "M-M-M-M---MM---M-M*-M-M-M-M-M-")
NEMOTRON_H_56B_PATTERN = ("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-"
                          "M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-")
NANO_V2_9B_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
NANO_V2_12B_PATTERN = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"
NEMOTRON3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"


def nemotron_h_model(pattern: str, hidden: int, ffn: int, heads: int, **sizes) -> ModelConfig:
    """What every Nemotron-H shape shares: squared-ReLU, RMSNorm, no biases, no position
    embedding (Mamba layers carry order), untied embeddings, GQA with 8 groups, Mamba heads of
    64 channels in 8 groups, the 131k vocabulary, 8k sequences."""
    model = ModelConfig(
        num_layers=len(layer_symbols(pattern)), hybrid_layer_pattern=pattern, hidden_size=hidden,
        ffn_hidden_size=ffn, num_attention_heads=heads, num_query_groups=8, seq_length=8192,
        vocab_size=NEMOTRON_H_VOCAB, activation="squared_relu", normalization="RMSNorm",
        position_embedding="none", add_bias_linear=False,
        share_embeddings_and_output_weights=False, mamba_head_dim=64, mamba_num_groups=8,
    )
    for name, value in sizes.items():
        setattr(model, name, value)
    return model


def nemotron3_moe(model: ModelConfig, experts: int, topk: int, width: int, shared: int,
                  scaling: float) -> ModelConfig:
    """Nemotron 3's routed MLPs: sigmoid scores with the aux-loss-free expert bias, a small
    per-sequence balance loss, scaled top-k weights, shared experts, the router in fp32."""
    model.num_moe_experts, model.moe_router_topk = experts, topk
    model.moe_ffn_hidden_size, model.moe_shared_expert_ffn_hidden_size = width, shared
    model.moe_router_topk_scaling_factor = scaling
    model.moe_router_score_function, model.moe_router_expert_bias = "sigmoid", True
    model.moe_load_balancing, model.moe_aux_loss_coeff = "seq_aux_loss", 1e-4
    model.moe_router_fp32, model.moe_token_dispatcher = True, "alltoall"
    return model


def _hybrid_run(model: ModelConfig, parallel: ParallelConfig, lr: float = 8e-4) -> RunConfig:
    """Megatron Bridge's Nemotron-H pretraining: 768 x 8k tokens per step, 2,000 warm-up."""
    cfg = large_run_base(model, lr=lr)
    cfg.parallel = parallel
    cfg.train.global_batch_size = 768
    return cfg


def nemotron_h_4b_tp1_dp64() -> RunConfig:
    """Nemotron-H 4B (52 layers: 24 Mamba2, 4 attention, 24 MLP) on 64 GPUs, TP1 x DP64."""
    model = nemotron_h_model(NEMOTRON_H_PATTERN, 3072, 12288, 32, kv_channels=128,
                             mamba_num_heads=112)
    return _hybrid_run(model, ParallelConfig())


def nemotron_h_8b_tp2_sp_dp32() -> RunConfig:
    """Nemotron-H 8B (52 layers, hidden 4096, 128 Mamba heads) on 64 GPUs, TP2 + SP x DP32."""
    model = nemotron_h_model(NEMOTRON_H_PATTERN, 4096, 21504, 32, mamba_num_heads=128)
    return _hybrid_run(model, ParallelConfig(tensor=2, sequence_parallel=True))


def nemotron_h_47b_tp8_sp_dp8() -> RunConfig:
    """Nemotron-H 47B (98 layers, hidden 8192, state 256) on 64 GPUs, TP8 + SP x DP8."""
    model = nemotron_h_model(NEMOTRON_H_47B_PATTERN, 8192, 30720, 64, mamba_num_heads=256,
                             mamba_state_dim=256)
    return _hybrid_run(model, ParallelConfig(tensor=8, sequence_parallel=True))


def nemotron_h_56b_tp8_sp_dp8() -> RunConfig:
    """Nemotron-H 56B (118 layers, hidden 8192, state 256) on 64 GPUs, TP8 + SP x DP8."""
    model = nemotron_h_model(NEMOTRON_H_56B_PATTERN, 8192, 32768, 64, mamba_num_heads=256,
                             mamba_state_dim=256)
    return _hybrid_run(model, ParallelConfig(tensor=8, sequence_parallel=True))


def nemotron_nano_v2_9b_tp2_sp_dp32() -> RunConfig:
    """Nemotron Nano v2 9B (56 layers, hidden 4480, Mamba heads of 80) on 64 GPUs, TP2 + SP."""
    model = nemotron_h_model(NANO_V2_9B_PATTERN, 4480, 15680, 40, kv_channels=128,
                             mamba_num_heads=128, mamba_head_dim=80)
    return _hybrid_run(model, ParallelConfig(tensor=2, sequence_parallel=True))


def nemotron_nano_v2_12b_tp4_sp_dp16() -> RunConfig:
    """Nemotron Nano v2 12B (62 layers, hidden 5120, Mamba heads of 80) on 64 GPUs, TP4 + SP."""
    model = nemotron_h_model(NANO_V2_12B_PATTERN, 5120, 20480, 40, kv_channels=128,
                             mamba_num_heads=128, mamba_head_dim=80)
    return _hybrid_run(model, ParallelConfig(tensor=4, sequence_parallel=True))


def phased_pretraining(cfg: RunConfig, tokens: float, quality_tokens: float, long_seq: int,
                       long_tokens: float, long_batch: int, long_cp: int) -> RunConfig:
    """What the phased Nemotron recipes share: token counts -> end steps of a general phase,
    a quality phase holding WSD's decay, and a long-context phase that relaunches with CP
    (a CP change, so the optimizer saves fully_reshardable); the blends are the examples in
    conf/data/nemotron_h_*.yaml."""
    seq, batch = cfg.model.seq_length, cfg.train.global_batch_size
    general = round((tokens - quality_tokens) / (seq * batch))
    decay = general + round(quality_tokens / (seq * batch))
    cfg.train.train_iters = decay + round(long_tokens / (long_seq * long_batch))
    cfg.scheduler.style = "wsd"
    cfg.checkpoint.optimizer_format = "fully_reshardable"  # the CP relaunch resumes CP1's state
    cfg.data.source, cfg.data.blend = "blend", "conf/data/nemotron_h_general.yaml"
    cfg.phases = [
        PhaseConfig(name="general", end_step=general, seq_length=seq),
        PhaseConfig(name="quality", end_step=decay, seq_length=seq, lr_decay=True,
                    blend="conf/data/nemotron_h_quality.yaml"),
        PhaseConfig(name="long_context", end_step=cfg.train.train_iters, relaunch=True,
                    seq_length=long_seq, context=long_cp, global_batch_size=long_batch,
                    blend="conf/data/nemotron_h_long_context.yaml"),
    ]
    return cfg


NANO_V2_TOKENS = 20e12  # reported pretraining tokens
NANO_V2_DECAY_TOKENS = 3.6e12  # reported: WSD decays over the final 3.6T tokens
NANO_V2_LONG_SEQ = 524_288  # reported: the long-context phase trains at 512k tokens a sequence
LONG_TOKENS = 20e9  # not published in what we read: this recipe's own length of that phase
LONG_BATCH, LONG_CP = 16, 16  # not published either: 16 x 512k per step on TP4 x CP16


def nemotron_nano_v2_12b_phases_tp4_sp_dp16() -> RunConfig:
    """Nemotron Nano v2 12B pretraining in phases on 64 GPUs: a two-phase data curriculum with
    WSD's decay in the second, then a long-context phase at 512k tokens with CP16.

    Reported (Nemotron Nano 2 report and model card): 20T tokens at 8192 x 768 sequences (the
    card says 736), WSD with peak lr 4.5e-4 decaying to 4.5e-6 over the final 3.6T tokens, a
    data curriculum that starts diverse and moves to higher-quality sources, then continued
    pretraining at sequence length 524,288. Not published in what we read: the curriculum's
    blend weights and its exact boundaries (the report has three data phases; here the second
    is the 3.6T of the decay), and the long phase's token count, batch, CP size and lr. This
    recipe takes 20B long-context tokens at 16 sequences per step on TP4 x CP16 and keeps
    WSD's min lr; the blends (conf/data/nemotron_h_*.yaml) are examples to replace.
    """
    cfg = phased_pretraining(nemotron_nano_v2_12b_tp4_sp_dp16(), NANO_V2_TOKENS,
                             NANO_V2_DECAY_TOKENS, NANO_V2_LONG_SEQ, LONG_TOKENS, LONG_BATCH,
                             LONG_CP)
    cfg.optimizer.lr, cfg.optimizer.min_lr = 4.5e-4, 4.5e-6
    return cfg


def nemotron3_nano_30b_a3b_model() -> ModelConfig:
    """Nemotron 3 Nano 30B-A3B: 52 layers (23 Mamba2, 23 MoE, 6 attention), hidden 2688,
    GQA 32/2, 128 routed experts of 1856 (top-6, x2.5) and a 3712-wide shared expert."""
    model = nemotron_h_model(NEMOTRON3_NANO_PATTERN, 2688, 1856, 32, num_query_groups=2,
                             kv_channels=128, mamba_num_heads=64)
    return nemotron3_moe(model, experts=128, topk=6, width=1856, shared=3712, scaling=2.5)


def nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16() -> RunConfig:
    """Nemotron 3 Nano 30B-A3B pretraining (stage 0) on 64 GPUs: TP4 + SP x DP16, experts EP8;
    seq 8192, batch 3072 x micro 2, lr 1.6e-3 -> 1.6e-5, 333 warm-up of 39,735 steps."""
    cfg = large_run_base(nemotron3_nano_30b_a3b_model(), lr=1.6e-3)
    cfg.parallel = ParallelConfig(tensor=4, sequence_parallel=True, expert=8, expert_tensor=1)
    cfg.train.global_batch_size, cfg.train.micro_batch_size = 3072, 2
    cfg.train.train_iters = 39_735
    cfg.optimizer.min_lr = 1.6e-5
    cfg.scheduler.warmup_iters = 333
    return cfg


NANO3_TOKENS, NANO3_QUALITY_TOKENS = 25e12, 1.5e12  # reported: 23.5T diverse, then 1.5T quality
NANO3_LONG_TOKENS, NANO3_LONG_BATCH = 121e9, 48  # reported: the LC phase's tokens and batch
NANO3_LONG_SEQ = 524_288  # not published in what we read: this recipe's own LC sequence
NANO3_LONG_CP = 16  # this recipe's own: TP4 x CP16 fills the 64 GPUs, 32k tokens a rank


def nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16() -> RunConfig:
    """Nemotron 3 Nano 30B-A3B pretraining in phases on 64 GPUs: 23.5T diverse tokens, 1.5T
    high-quality tokens holding WSD's decay, then a long-context phase with CP16 (EP8 kept).

    Reported (Nemotron 3 Nano technical report, as NVIDIA's Nemotron training docs summarise
    it; model card): 25T tokens with WSD in two data phases (23.5T for diversity, 1.5T of
    higher-quality data), then an LC phase of 121B tokens at global batch 48 with a constant
    lr of 1e-5, the model supporting contexts up to 1M tokens. Not published in what we read:
    the LC phase's sequence length and the blends' weights; the reported decay also spans the
    final 5T (20%), wider than phase 2, and the LC layout is TP8 x PP4 x CP8 x EP8. This
    recipe's own choices: 524,288 tokens a sequence, WSD's decay over phase 2 only, the LC
    phase on TP4 x CP16 (DP1 divides the batch of 48; experts stay EP8 x expert-DP8 over the
    same 64 GPUs) holding the base recipe's min lr; the blends are examples to replace.
    """
    return phased_pretraining(nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16(), NANO3_TOKENS,
                              NANO3_QUALITY_TOKENS, NANO3_LONG_SEQ, NANO3_LONG_TOKENS,
                              NANO3_LONG_BATCH, NANO3_LONG_CP)


# The tiny hybrid: every layer kind once or twice, Mamba heads 8 x 16 in 2 groups, state 16.
TINY_HYBRID_PATTERN = "M*-ME-"


def hybrid_tiny_base(ranks: int = 1, pattern: str = TINY_HYBRID_PATTERN) -> RunConfig:
    """`tiny_base`'s batch and data with a 6-layer hybrid of all four kinds, MoE routed as in
    Nemotron 3 (4 experts top-2, sigmoid + expert bias, seq_aux_loss, a shared expert)."""
    cfg = tiny_base(ranks)
    model = nemotron_h_model(pattern, 64, 128, 4, num_query_groups=2, seq_length=128,
                             vocab_size=256, mamba_num_heads=8, mamba_head_dim=16,
                             mamba_num_groups=2, mamba_state_dim=16, mamba_chunk_size=32)
    cfg.model = nemotron3_moe(model, experts=4, topk=2, width=64, shared=64, scaling=1.0)
    return cfg


def hybrid_tiny_dp1() -> RunConfig:
    """Tiny hybrid (M*-ME-) on one rank: the reference every hybrid layout must match."""
    return hybrid_tiny_base(ranks=1)


def hybrid_tiny_tp2_sp() -> RunConfig:
    """Tiny hybrid, TP2 + sequence parallel (Mamba heads and groups split over TP)."""
    cfg = hybrid_tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(tensor=2, sequence_parallel=True)
    return cfg


def hybrid_tiny_pp2() -> RunConfig:
    """Tiny hybrid, 2 pipeline stages split evenly (3 layers each, no '|')."""
    cfg = hybrid_tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(pipeline=2)
    return cfg


def hybrid_tiny_pp2_pipes() -> RunConfig:
    """Tiny hybrid, 2 pipeline stages cut by '|' where the pattern says (M*-M | E-)."""
    cfg = hybrid_tiny_base(ranks=2, pattern="M*-M|E-")
    cfg.parallel = ParallelConfig(pipeline=2)
    return cfg


def hybrid_tiny_pp2_vpp2() -> RunConfig:
    """Tiny hybrid, PP2 x VPP2 from four '|' segments (M* | -M | E | -)."""
    cfg = hybrid_tiny_base(ranks=2, pattern="M*|-M|E|-")
    cfg.parallel = ParallelConfig(pipeline=2, virtual_pipeline=2)
    return cfg


def hybrid_tiny_dp2_distopt() -> RunConfig:
    """Tiny hybrid, 2 data-parallel ranks with the distributed optimizer."""
    cfg = hybrid_tiny_base(ranks=2)
    cfg.optimizer.distributed = True
    return cfg


def hybrid_tiny_ep2_dp2() -> RunConfig:
    """Tiny hybrid, the MoE layer's 4 experts split over 2 ranks (EP2 x DP2)."""
    cfg = hybrid_tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(expert=2)
    return cfg


RECIPES = (
    nemotron_h_4b_tp1_dp64,
    nemotron_h_8b_tp2_sp_dp32,
    nemotron_h_47b_tp8_sp_dp8,
    nemotron_h_56b_tp8_sp_dp8,
    nemotron_nano_v2_9b_tp2_sp_dp32,
    nemotron_nano_v2_12b_tp4_sp_dp16,
    nemotron_nano_v2_12b_phases_tp4_sp_dp16,
    nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16,
    nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16,
    hybrid_tiny_dp1,
    hybrid_tiny_tp2_sp,
    hybrid_tiny_pp2,
    hybrid_tiny_pp2_pipes,
    hybrid_tiny_pp2_vpp2,
    hybrid_tiny_dp2_distopt,
    hybrid_tiny_ep2_dp2,
)
