"""Nemotron 3 Super 120B-A12B, and tiny Super-shaped hybrids for CPU ranks.

Nemotron 3 Super is a hybrid Mamba-Transformer whose MoE layers route in a latent space
(`model.moe_latent_size`: 512 experts, top-22, latent 1024 of the model's 4096), with two
multi-token-prediction depths sharing one set of weights (`/*E/*E` after the pattern,
`model.mtp_use_repeated_layer`), pretrained on 25T tokens in NVFP4 with the last layers in
BF16. The tiny hybrids have every one of those features at CPU size: NVIDIA's own tiny Super
pattern `MEM*EME` (Mamba2, latent MoE, attention) with two shared MTP depths of an attention
and a latent-MoE layer; `super_tiny_dp1` is the one-rank reference every layout must match.
"""

from __future__ import annotations

from recipes.base_64gpu import RUN_64GPU
from recipes.config.schema import ParallelConfig, PhaseConfig, RunConfig
from recipes.nemotron.citations import (
    BRIDGE_OPTIMIZER,
    S3_BRIDGE,
    S3_COMMON,
    S3_CONFIG,
    S3_DOCS,
    S3_PAPER,
    S3_PRECISION,
    S3_PROVIDER,
    S3_RECIPE,
    S3_TINY,
    SOFTMAX_NOTE,
    SUPER_BLEND1,
    SUPER_BLEND2,
    SUPER_BLEND_LC,
    SUPER_LC1,
    SUPER_LC2,
    SUPER_PHASE1,
    SUPER_PHASE2,
)
from recipes.nemotron.nemotron_h import EOD_NOTE, SOFTMAX, hybrid_tiny_base
from recipes.sources import Settings, differs, ours, published, sourced_recipe, unpublished

# Nemotron 3 Super's 88 layers (40 Mamba-2, 40 latent MoE, 8 attention), from its config.json,
# then its MTP depths: one stored depth of attention + MoE (`mtp_hybrid_override_pattern` *E),
# which Megatron runs twice with shared weights.
SUPER_PATTERN = ("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*"
                 "EMEMEMEME")
SUPER_MTP = "/*E/*E"
SUPER_SEQ, SUPER_BATCH, SUPER_STEPS = 8192, 3072, 993_404
SUPER_PHASE1_END = 794_723  # 80% of the steps: phase 1's 20T of 25T tokens
SUPER_LC_SEQ, SUPER_LC_BATCH = 1_048_576, 16
SUPER_LC1_STEPS, SUPER_LC2_STEPS = 2027, 1014
# Bridge's precision recipe NVIDIA pretrained Super with on B200: NVFP4, the last 14 layers BF16.
SUPER_NVFP4 = ["plugins.fp8.format=e2m1", "plugins.fp8.recipe=nvfp4",
               "plugins.fp8.last_layers_bf16=14"]

def super_shape() -> Settings:
    """Nemotron 3 Super's model (NVIDIA's docs and its config.json): the hybrid pattern with two
    MTP depths sharing one layer, latent MoE (512 experts, top-22, latent 1024 of 4096), the
    Nemotron 3 router, and what every Nemotron hybrid shares (squared ReLU, RMSNorm, no
    position embedding, bias or dropout, untied)."""
    return {
        "model.hybrid_layer_pattern": published(
            SUPER_PATTERN + SUPER_MTP,
            f"{S3_CONFIG}: hybrid_override_pattern, then mtp_hybrid_override_pattern *E twice "
            f"({S3_RECIPE}:94, 98; {S3_DOCS}:35)",
            f"NVIDIA's docs draw the pattern only as a figure ({S3_DOCS}:59-63); the config.json "
            "read here is a third-party transcription, its counts (40 M, 40 E, 8 *) the docs' "
            "(:21)", secondary=True),
        "model.num_layers": published(88, f"{S3_DOCS}:21; the pattern's length (40 M, 40 E, 8 *)"),
        "model.mtp_use_repeated_layer": published(True, f"{S3_DOCS}:35, 57 (MTP layers with "
                                                        f"shared weights); {S3_RECIPE}:98"),
        "model.mtp_loss_scaling_factor": published(0.3, f"{S3_DOCS}:127; {S3_RECIPE}:97"),
        "model.hidden_size": published(4096, f"{S3_DOCS}:22"),
        "model.ffn_hidden_size": published(2688, f"{S3_CONFIG}: intermediate_size (no dense "
                                                 "MLP layer)", secondary=True),
        "model.num_attention_heads": published(32, f"{S3_DOCS}:23"),
        "model.num_query_groups": published(2, f"{S3_DOCS}:24"),
        "model.kv_channels": published(128, f"{S3_DOCS}:25"),
        "model.mamba_state_dim": published(128, f"{S3_DOCS}:26"),
        "model.mamba_num_groups": published(8, f"{S3_DOCS}:27"),
        "model.mamba_num_heads": published(128, f"{S3_DOCS}:28"),
        "model.mamba_head_dim": published(64, f"{S3_DOCS}:29"),
        "model.mamba_conv_kernel": published(4, f"{S3_CONFIG}: conv_kernel", secondary=True),
        "model.mamba_chunk_size": published(128, f"{S3_CONFIG}: chunk_size", secondary=True),
        "model.seq_length": published(SUPER_SEQ, f"{S3_DOCS}:119; {S3_RECIPE}:53"),
        "model.vocab_size": published(131_072, f"{S3_CONFIG}: vocab_size", secondary=True),
        "model.activation": published("squared_relu", f"{S3_DOCS}:48"),
        "model.normalization": published("RMSNorm", f"{S3_DOCS}:63"),
        "model.position_embedding": published("none", f"{S3_DOCS}:63",
                                              "the config.json's rope_theta is unused: "
                                              f"{S3_BRIDGE}:274"),
        "model.add_bias_linear": published(False, f"{S3_DOCS}:63"),
        "model.share_embeddings_and_output_weights": published(False, f"{S3_DOCS}:63"),
        "model.hidden_dropout": published(0.0, f"{S3_DOCS}:63"),
        "model.attention_dropout": published(0.0, f"{S3_DOCS}:63"),
        SOFTMAX: unpublished(False, f"{S3_BRIDGE}:281; {S3_PROVIDER}:43", SOFTMAX_NOTE),
        "model.init_method_std": unpublished(0.014, f"{S3_RECIPE}:128; {S3_TINY}:105",
                                             "the config.json's initializer_range 0.02 is not "
                                             "the pretraining value"),
        "model.num_moe_experts": published(512, f"{S3_DOCS}:32"),
        "model.moe_router_topk": published(22, f"{S3_DOCS}:33"),
        "model.moe_ffn_hidden_size": published(2688, f"{S3_DOCS}:30"),
        "model.moe_shared_expert_ffn_hidden_size": published(5376, f"{S3_DOCS}:31"),
        "model.moe_latent_size": published(1024, f"{S3_DOCS}:34, 39-41"),
        "model.moe_router_topk_scaling_factor": published(5.0, f"{S3_CONFIG}: "
                                                               "routed_scaling_factor",
                                                          secondary=True),
        "model.moe_router_score_function": published("sigmoid", f"{S3_DOCS}:48"),
        "model.moe_router_expert_bias": published(True, f"{S3_DOCS}:48 (aux-loss-free)"),
        "model.moe_router_bias_update_rate": published(1e-3, f"{S3_DOCS}:48"),
        "model.moe_aux_loss_coeff": published(1e-4, f"{S3_DOCS}:48"),
        "model.moe_load_balancing": unpublished("seq_aux_loss", f"{S3_BRIDGE}:293"),
        "model.moe_router_fp32": unpublished(True, f"{S3_BRIDGE}:294"),
    }


def super_fast_paths() -> Settings:
    """The GPU fast paths of Bridge's Super recipe: grouped-GEMM experts with fused permutation
    and the fused weighted squared ReLU, the all-to-all dispatcher without shared-expert
    overlap. Its CUDA graphs of attention, Mamba and the router are off here: they cannot
    replay layers that full recompute rebuilds (`super_run`'s recompute)."""
    return {
        "model.moe_grouped_gemm": unpublished(True, f"{S3_PROVIDER}:53"),
        "model.moe_permute_fusion": unpublished(True, f"{S3_PROVIDER}:55"),
        "model.moe_token_dispatcher": unpublished("alltoall", f"{S3_RECIPE}:65"),
        "model.moe_shared_expert_overlap": unpublished(False, f"{S3_RECIPE}:66"),
        "model.moe_fused_squared_relu": unpublished(True, f"{S3_RECIPE}:131 "
                                                          "(use_fused_weighted_squared_relu)"),
        "train.cuda_graphs": differs("none", f"{S3_RECIPE}:83-85 (transformer_engine: attn, "
                                             "mamba, moe_router, moe_preprocess)",
                                     "Megatron graphs a fully recomputed layer only in a "
                                     "full-iteration graph, and this recipe recomputes fully"),
    }


def super_run(expert: int) -> Settings:
    """Nemotron 3 Super's published pretraining run (NVIDIA's docs and stage-0 configs): 25T
    tokens of 8k sequences, batch 3072, WSD 4.5e-4 -> 4.5e-6 with a 200B-token warm-up and a
    minus-sqrt decay over the final 5T; on 64 GPUs, TP4 + SP with the experts over `expert`."""
    return RUN_64GPU | super_shape() | super_fast_paths() | {
        "train.global_batch_size": published(SUPER_BATCH, f"{S3_DOCS}:118; {S3_RECIPE}:71"),
        "train.micro_batch_size": unpublished(1, f"{S3_RECIPE}:72"),
        "train.train_iters": published(SUPER_STEPS, f"{SUPER_PHASE1}:23; {S3_DOCS}:117 (25T "
                                                    "tokens)",
                                       "25T tokens are 993,411 steps of 3072 x 8192; NVIDIA's "
                                       f"config trains 993,404 (Bridge's demo: 39,735, "
                                       f"{S3_RECIPE}:70)"),
        "optimizer.lr": published(4.5e-4, f"{S3_DOCS}:120; {S3_RECIPE}:104"),
        "optimizer.min_lr": published(4.5e-6, f"{S3_DOCS}:121; {S3_RECIPE}:105"),
        "scheduler.style": published("wsd", f"{S3_DOCS}:124; {SUPER_PHASE1}:26"),
        "scheduler.warmup_iters": published(7949, f"{SUPER_PHASE1}:28; {S3_DOCS}:125 (200B "
                                                  "tokens)",
                                            f"Bridge's demo: 333 ({S3_RECIPE}:110)"),
        "scheduler.decay_iters": published(992_411, f"{SUPER_PHASE1}:29",
                                           "993 steps short of the run: its last steps hold "
                                           "the min lr"),
        "scheduler.wsd_decay_iters": published(198_682, f"{SUPER_PHASE1}:30; {S3_DOCS}:126 "
                                                         "(the final 5T tokens)"),
        "scheduler.wsd_decay_style": published("minus_sqrt", f"{SUPER_PHASE1}:27; "
                                                             f"{S3_DOCS}:126"),
        "optimizer.weight_decay": published(0.1, f"{S3_DOCS}:123; {S3_RECIPE}:106, 111-112",
                                            "Bridge applies 0.1 here (start/end weight decay "
                                            "0.1)"),
        "optimizer.adam_beta1": published(0.9, f"{S3_DOCS}:122; {S3_RECIPE}:107"),
        "optimizer.adam_beta2": published(0.95, f"{S3_DOCS}:122; {S3_RECIPE}:108"),
        "optimizer.adam_eps": unpublished(1e-8, f"{S3_RECIPE}:109"),
        "optimizer.clip_grad": unpublished(1.0, f"{BRIDGE_OPTIMIZER}:118"),
        "train.eval_interval": unpublished(1000, f"{S3_RECIPE}:77"),
        "train.eval_iters": unpublished(32, f"{S3_COMMON}:74"),
        "data.eod_mask_loss": unpublished(False, f"{S3_COMMON}:94", EOD_NOTE),
        "precision.dtype": published("bf16", f"{S3_DOCS}:128 ('BF16 mixed (NVFP4 mixed for "
                                             "B200)')"),
        "plugins.fp8.format": differs(
            None, f"{S3_DOCS}:128 (BF16 mixed, NVFP4 mixed for B200), 132 (the 25T run: NVFP4 "
                  "on B200 throughout)",
            "NVIDIA's 25T run trained NVFP4 on B200, which these 80-GB H100s cannot run; on "
            f"Blackwell add {' '.join(SUPER_NVFP4)} (Bridge's preset, {S3_PRECISION}:396-421); "
            "that still differs from the published run, which also kept the latent projections, "
            f"the MTP layers (Bridge's keep_mtp_spec_in_bf16, {S3_RECIPE}:95) and the QKV and "
            "attention projections in BF16 and Mamba's output projection in MXFP8 "
            f"({S3_DOCS}:134-142): no plugins.fp8 field sets these"),
        "parallel.tensor": published(4, f"{S3_DOCS}:174; {S3_RECIPE}:44"),
        "parallel.sequence_parallel": published(True, f"{S3_RECIPE}:49"),
        "parallel.expert_tensor": unpublished(1, f"{S3_RECIPE}:50"),
        "train.recompute": ours("full", "88 layers' activations of an 8k row (45.1 GB a rank at "
                                        "TP4 + SP) beside 48 GB of model state overflow an "
                                        "80-GB GPU; full recompute keeps 6.2 GB (scripts/plan.py)"),
        "parallel.expert": differs(expert, f"{S3_DOCS}:174 (EP8, on B200); {S3_RECIPE}:51",
                                   "113B routed-expert weights over 8 ranks do not fit an "
                                   "80-GB GPU: over 64 here, as NVIDIA's long-context stage "
                                   f"({SUPER_LC1}:35)"),
    }


@sourced_recipe
def nemotron3_super_120b_a12b_tp4_sp_ep64_dp16() -> Settings:
    """Nemotron 3 Super 120B-A12B pretraining as published on 64 GPUs: TP4 + SP x DP16, the
    512 latent experts over EP64; 25T tokens of 8k sequences, batch 3072, WSD 4.5e-4 -> 4.5e-6
    decaying (minus-sqrt) over the final 5T, two MTP depths sharing one layer (loss x 0.3), one
    blend (the phased recipe has the two data phases and the long-context stages).

    Published: NVFP4 on B200 with the last layers in BF16; this recipe trains in BF16 (NVIDIA's
    docs name both) on 80-GB H100s, which run no FP4 GEMMs: on Blackwell add
    `plugins.fp8.format=e2m1 plugins.fp8.recipe=nvfp4 plugins.fp8.last_layers_bf16=14`, which
    still leaves in NVFP4 what the published run kept in BF16 (the latent projections, the MTP
    layers, the QKV and attention projections) or MXFP8 (Mamba's output projection).
    """
    return super_run(expert=64)


@sourced_recipe
def nemotron3_super_120b_a12b_phases_tp4_sp_ep64_dp16() -> Settings:
    """Nemotron 3 Super 120B-A12B pretraining in its published phases on 64 GPUs: 20T diverse
    tokens, 5T high-quality tokens (WSD's minus-sqrt decay), then the long-context stages at a
    constant 4.5e-6: 34B tokens of 1M-token rows, then 17B tokens more (published as 1M and 4K
    rows in turn), each on CP16 (TP4 x CP16, EP64 kept).

    Published (NVIDIA's docs and stage-0 configs): the long-context stages train 1M-token
    sequences, 16 a step, on TP2 x CP64 x EP64 (GB200), the second alternating 1M and 4K ones;
    their alternation is not published and Bridge cannot load it (the config's own note). Here
    both stages are 1M-token rows of the long-context blend; the layout is TP4 x CP16 on 64
    GPUs, which does NOT fit 80-GB H100s (scripts/plan.py: 97.7 GB a rank), so
    scripts/launch.py refuses this recipe on conf/cluster/h100_80gb_8x8.yaml. A phase cannot
    change TP or the GPU count: train the long-context stages as a run of their own in
    NVIDIA's layout on 128 GPUs (it plans at 72.6 GB a rank; `print=megatron_args` names the
    overrides, plus parallel.tensor=2 parallel.context=64 cluster.nodes=16), or on GPUs with
    more memory. The blends (conf/data/nemotron3_super_*.yaml) carry NVIDIA's per-dataset
    weights; their paths are where you prepare each dataset.
    """
    prepare = ("NVIDIA's per-dataset weights, the internal-only categories included; the paths "
               "are where you prepare each dataset")
    lc_end = SUPER_STEPS + SUPER_LC1_STEPS
    return super_run(expert=64) | {
        "train.train_iters": published(
            lc_end + SUPER_LC2_STEPS, f"{SUPER_PHASE1}:23 (993,404); {SUPER_LC1}:41 (2,027: "
            f"34B tokens); {SUPER_LC2}:35-37 (1,014, the config's 'rough estimate' of 17B)"),
        "checkpoint.optimizer_format": ours("fully_reshardable", "the CP16 relaunch resumes "
                                                                 "the CP1 optimizer state"),
        "data.source": ours("blend", "prepared data named by the phases' blends"),
        "data.blend": published("conf/data/nemotron3_super_phase1.yaml", SUPER_BLEND1, prepare),
        "phases[0]": published(PhaseConfig(name="diverse", end_step=SUPER_PHASE1_END,
                                           seq_length=SUPER_SEQ, documents="concatenate"),
                               f"{SUPER_PHASE1}:1-5; {S3_DOCS}:87-92; {S3_PAPER}:76-90: 20T "
                               f"tokens (80%), diversity; its blend: {SUPER_BLEND1}", prepare),
        "phases[1]": published(PhaseConfig(name="quality", end_step=SUPER_STEPS,
                                           seq_length=SUPER_SEQ, documents="concatenate",
                                           blend="conf/data/nemotron3_super_phase2.yaml"),
                               f"{SUPER_PHASE2}:1-4; {S3_DOCS}:87-92; {S3_PAPER}:92-106: 5T "
                               "tokens (20%), high quality, during the decay; its blend: "
                               f"{SUPER_BLEND2}", prepare),
        "phases[2]": differs(PhaseConfig(name="long_context_1m", end_step=lc_end,
                                         seq_length=SUPER_LC_SEQ, context=16,
                                         global_batch_size=SUPER_LC_BATCH,
                                         documents="concatenate", micro_batch_size=1,
                                         blend="conf/data/nemotron3_super_long_context.yaml",
                                         relaunch=True),
                             f"{SUPER_LC1}:31-51; {S3_DOCS}:160-176 (1M tokens, 16 a step, "
                             "34B tokens, 4.5e-6 constant, TP2 x CP64 x EP64); its blend: "
                             f"{SUPER_BLEND_LC}, the document QA at 20% ({S3_DOCS}:179)",
                             "TP4 x CP16 x EP64 on 64 GPUs, which does not fit 80-GB H100s "
                             "(scripts/plan.py: 97.7 GB a rank; NVIDIA's TP2 x CP64 on 128 "
                             "GPUs: 72.6 GB) and a phase cannot change TP or the GPU count: "
                             "launch refuses it there; the lr is the min lr WSD holds after "
                             "its decay (4.5e-6)"),
        "phases[3]": differs(PhaseConfig(name="long_context_mixed", end_step=lc_end
                                         + SUPER_LC2_STEPS, seq_length=SUPER_LC_SEQ, context=16,
                                         global_batch_size=SUPER_LC_BATCH,
                                         documents="concatenate", micro_batch_size=1,
                                         blend="conf/data/nemotron3_super_long_context.yaml"),
                             f"{SUPER_LC2}:1-45; {S3_DOCS}:177 (17B tokens alternating 1M and "
                             "4K sequences)",
                             "the alternation is unpublished and Bridge has no loader for it "
                             f"({SUPER_LC2}:14-17): 1M-token rows only, the same blend"),
    }


# NVIDIA's tiny Super (Nemotron@e27b371:src/nemotron/recipes/super3/tiny_model.py:57, 72-74):
# the main pattern, then two MTP depths of attention + MoE sharing their weights.
TINY_SUPER_MAIN = "MEM*EME"
TINY_SUPER_MTP = "/*E/*E"


def super_tiny_base(ranks: int = 1, main: str = TINY_SUPER_MAIN) -> RunConfig:
    """The tiny hybrid's sizes with Super's features: latent MoE (latent 32 of 64), two MTP
    depths of attention + latent MoE sharing one layer, MTP loss scale 0.3."""
    cfg = hybrid_tiny_base(ranks, pattern=main + TINY_SUPER_MTP)
    cfg.model.moe_latent_size = 32
    cfg.model.mtp_use_repeated_layer = True
    cfg.model.mtp_loss_scaling_factor = 0.3
    return cfg


def super_tiny_dp1() -> RunConfig:
    """Tiny Super-shaped hybrid (MEM*EME/*E/*E, latent MoE, 2 shared MTP depths) on one rank:
    the reference every layout must match."""
    return super_tiny_base(ranks=1)


def super_tiny_tp2_sp() -> RunConfig:
    """Tiny Super, TP2 + sequence parallel (the latent projections whole on both ranks)."""
    cfg = super_tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(tensor=2, sequence_parallel=True)
    return cfg


def super_tiny_pp2() -> RunConfig:
    """Tiny Super, 2 pipeline stages (MEM* | EME), the MTP depths on the last."""
    cfg = super_tiny_base(ranks=2, main="MEM*|EME")
    cfg.parallel = ParallelConfig(pipeline=2)
    return cfg


def super_tiny_pp2_vpp2() -> RunConfig:
    """Tiny Super, PP2 x VPP2 from four segments (ME | M* | EM | E), the MTP depths on the
    last stage's last virtual stage."""
    cfg = super_tiny_base(ranks=2, main="ME|M*|EM|E")
    cfg.parallel = ParallelConfig(pipeline=2, virtual_pipeline=2)
    return cfg


def super_tiny_ep2_dp2() -> RunConfig:
    """Tiny Super, each MoE layer's 4 latent experts split over 2 ranks (EP2 x DP2)."""
    cfg = super_tiny_base(ranks=2)
    cfg.parallel = ParallelConfig(expert=2)
    return cfg


def super_tiny_dp2_distopt() -> RunConfig:
    """Tiny Super, 2 data-parallel ranks with the distributed optimizer."""
    cfg = super_tiny_base(ranks=2)
    cfg.optimizer.distributed = True
    return cfg


def super_tiny_tp2_sp_pp2_ep2() -> RunConfig:
    """Tiny Super, three at once on 4 ranks: TP2 + SP x PP2 (MEM* | EME, MTP on the last
    stage), the experts over EP2 without expert-TP."""
    cfg = super_tiny_base(ranks=4, main="MEM*|EME")
    cfg.parallel = ParallelConfig(tensor=2, sequence_parallel=True, pipeline=2, expert=2,
                                  expert_tensor=1)
    return cfg


RECIPES = (
    nemotron3_super_120b_a12b_tp4_sp_ep64_dp16,
    nemotron3_super_120b_a12b_phases_tp4_sp_ep64_dp16,
    super_tiny_dp1,
    super_tiny_tp2_sp,
    super_tiny_pp2,
    super_tiny_pp2_vpp2,
    super_tiny_ep2_dp2,
    super_tiny_dp2_distopt,
    super_tiny_tp2_sp_pp2_ep2,
)
