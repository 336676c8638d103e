"""Hybrid Mamba-Transformer recipes on Megatron Core's HybridModel: Nemotron-H 4B/8B/47B/56B,
Nemotron Nano v2 9B/12B (12B also in its reported phases), Nemotron 3 Nano 30B-A3B (also in its
reported phases), and tiny hybrids for CPU ranks.

Every Nemotron recipe is a table of settings, each beside its source (`recipes/sources.py`):
the published pretraining run where NVIDIA published it (reports, model cards, NVIDIA's docs),
else Megatron Bridge's value, marked as not published, and where this recipe differs (a layout
re-cut for 64 GPUs) it says why; `docs/nemotron.md` is generated from these tables. The shapes
are Megatron Bridge's `nemotronh` providers (equal, pattern for pattern, to NVIDIA's released
configs). Nemotron-H 4B and 47B and Nano v2 9B were not pretrained by NVIDIA but pruned and
distilled from a larger model: their recipes are the shape with Bridge's demo pretraining.

The tiny hybrids share one model with all four layer kinds (Mamba2, attention, MLP, MoE routed
the Nemotron 3 way) and one batch, so their losses are comparable layout to layout;
`hybrid_tiny_dp1` is the one-rank reference.
"""

from __future__ import annotations

from recipes.base_64gpu import RUN_64GPU
from recipes.config.schema import ModelConfig, ParallelConfig, PhaseConfig, RunConfig
from recipes.models.hybrid.pattern import layer_symbols
from recipes.nemotron.citations import (
    BRIDGE_COMMON,
    BRIDGE_OPTIMIZER,
    BRIDGE_WEIGHT_DECAY,
    COMM_OVERLAP,
    H8B_CONFIG,
    H_4B_CARD,
    H_47B_CARD,
    H_PAGE,
    H_PERF,
    H_PROVIDER,
    H_RECIPE,
    MAMBA_PROVIDER,
    MEGATRON_CORE,
    MIXED_PRECISION,
    N3_ARCHITECTURE,
    N3_CARD,
    N3_CONFIG,
    N3_DOCS,
    N3_PAPER,
    N3_PERF,
    N3_PROVIDER,
    N3_RECIPE,
    N3_RECIPE_NOW,
    N3_REPORT,
    NANO2_CARD,
    NANO2_REPORT,
    SOFTMAX_NOTE,
    SUPER_PHASE1,
    V2_9B_CONFIG,
    V2_RECIPE,
)
from recipes.sources import (
    Setting,
    Settings,
    build,
    differs,
    ours,
    published,
    sourced_recipe,
    steps_for_tokens,
    unpublished,
)
from recipes.tiny import tiny_base

# Nemotron-H 4B and 8B share one 52-layer pattern.
NEMOTRON_H_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NEMOTRON_H_47B_PATTERN = ("M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-"
                          "M-M-M-M---MM---M-M*-M-M-M-M-M-")
NEMOTRON_H_56B_PATTERN = ("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-"
                          "M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-")
NANO_V2_9B_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
NANO_V2_12B_PATTERN = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"
NEMOTRON3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
SEQ = 8192  # every Nemotron-H, Nano v2 and Nemotron 3 Nano pretraining sequence
LONG_SEQ = 524_288  # the long-context phases' 512k-token rows
# Megatron Bridge's Nemotron-H providers normalise attention scores in the run's precision.
SOFTMAX = "model.attention_softmax_in_fp32"


# --- the Nemotron-H family's shape ----------------------------------------------------------

def nemotron_h_shape() -> Settings:
    """What every Nemotron-H shape shares (Bridge's Mamba and Nemotron-H providers): squared
    ReLU, RMSNorm, no biases, no position embedding (Mamba layers carry order), untied
    embeddings, no dropout, GQA with 8 groups, Mamba heads of 64 channels in 8 groups, the 131k
    vocabulary, 8k sequences."""
    return {
        "model.seq_length": published(SEQ, f"{H_PROVIDER}:34; {H_RECIPE}:90",
                                      "model cards: 8K context"),
        "model.vocab_size": published(131_072, f"{H8B_CONFIG}: vocab_size", secondary=True),
        "model.activation": published("squared_relu", f"{H_PROVIDER}:39"),
        "model.normalization": published("RMSNorm", f"{MAMBA_PROVIDER}:165"),
        "model.position_embedding": published("none", f"{MAMBA_PROVIDER}:158",
                                              "Bridge's docs page says RoPE; its code has none"),
        "model.add_bias_linear": published(False, f"{MAMBA_PROVIDER}:166"),
        "model.share_embeddings_and_output_weights": published(False, f"{MAMBA_PROVIDER}:145"),
        "model.hidden_dropout": published(0.0, f"{MAMBA_PROVIDER}:167"),
        "model.attention_dropout": published(0.0, f"{MAMBA_PROVIDER}:168"),
        SOFTMAX: unpublished(False, f"{H_PROVIDER}:43", SOFTMAX_NOTE),
        "model.num_query_groups": published(8, f"{H_PROVIDER}:37"),
        "model.kv_channels": published(None, f"{H_PROVIDER} (not set: hidden / heads = 128)"),
        "model.mamba_head_dim": published(64, f"{H_PROVIDER}:36"),
        "model.mamba_num_groups": published(8, f"{H_PROVIDER}:35"),
        "model.mamba_state_dim": published(128, f"{MEGATRON_CORE}/transformer/"
                                                "transformer_config.py:1179 (Bridge keeps "
                                                "Megatron's default)"),
        "model.mamba_conv_kernel": unpublished(4, f"{MEGATRON_CORE}/ssm/mamba_mixer.py:177"),
        "model.mamba_chunk_size": unpublished(128, f"{MEGATRON_CORE}/ssm/mamba_mixer.py:192"),
        "model.init_method_std": unpublished(0.02, f"{MEGATRON_CORE}/transformer/"
                                                   "transformer_config.py:386 (Bridge sets "
                                                   "none for Nemotron-H)"),
    }


def pattern(symbols: str, where: str) -> Settings:
    """A hybrid layer pattern and the layer count it gives, from one source."""
    return {"model.hybrid_layer_pattern": published(symbols, where),
            "model.num_layers": published(len(layer_symbols(symbols)), f"{where} (its length)")}


def nemotron_h_model(symbols: str, hidden: int, ffn: int, heads: int, **sizes) -> ModelConfig:
    """A Nemotron-H-shaped model of these sizes (the tiny hybrids'): the shape only; its
    attention softmax stays at the project's default, as in the other tiny recipes."""
    shape = {key: value for key, value in nemotron_h_shape().items() if key != SOFTMAX}
    model = build(shape).model
    model.hybrid_layer_pattern, model.num_layers = symbols, len(layer_symbols(symbols))
    model.hidden_size, model.ffn_hidden_size, model.num_attention_heads = hidden, ffn, heads
    for name, value in sizes.items():
        setattr(model, name, value)
    return model


# --- training: Megatron Bridge's pretraining recipes, where nothing is published -------------

def bridge_optimizer() -> Settings:
    """Bridge's optimizer and schedule for every Nemotron-H and Nano v2 recipe
    (`_pretrain_common`), none of them published for Nemotron-H."""
    return {
        "optimizer.lr": unpublished(3e-4, f"{BRIDGE_COMMON}:56"),
        "optimizer.min_lr": unpublished(3e-5, f"{BRIDGE_COMMON}:57"),
        "scheduler.style": unpublished("cosine", f"{BRIDGE_OPTIMIZER}:122, 166"),
        "optimizer.weight_decay": unpublished(0.1, f"{BRIDGE_OPTIMIZER}:108-123",
                                              BRIDGE_WEIGHT_DECAY),
        "optimizer.adam_beta1": unpublished(0.9, f"{BRIDGE_OPTIMIZER}:112"),
        "optimizer.adam_beta2": unpublished(0.95, f"{BRIDGE_OPTIMIZER}:113"),
        "optimizer.adam_eps": unpublished(1e-8, f"{BRIDGE_OPTIMIZER}:114",
                                          "1e-5 before Bridge's b273cd371"),
        "optimizer.clip_grad": unpublished(1.0, f"{BRIDGE_OPTIMIZER}:118"),
    }


# Megatron Bridge's datasets keep the loss on the token after each end-of-document.
EOD_NOTE = ("this project's default is true (no loss where the input is the end-of-document "
            "token)")


def bridge_eval_and_mask(interval: str) -> Settings:
    """Bridge's held-out evaluation and loss mask for the Nemotron-H and Nano v2 recipes
    (`_pretrain_common`; `interval` is the recipe's eval-interval line), none published."""
    return {
        "data.eod_mask_loss": unpublished(False, f"{BRIDGE_COMMON}:94", EOD_NOTE),
        "train.eval_iters": unpublished(32, f"{BRIDGE_COMMON}:74"),
        "train.eval_interval": differs(1000, f"{interval} (every 10 steps)",
                                       "Bridge's demo evaluates 32 batches every 10 steps, more "
                                       "forward passes than training; every 1,000 here"),
    }


def bridge_run(recipe: str, batch: int, warmup: int, iters: int, evaluation: int, precision: int,
               precision_name: str = "bf16_mixed") -> Settings:
    """A Bridge Nemotron-H / Nano v2 recipe's batch, warm-up, demo length and precision (lines
    of `recipe`): 768 x 8k tokens per step, 2,000 warm-up steps, 1,168,251 steps (7.35T
    tokens), BF16 (`precision_name`, Bridge's mixed-precision recipe at that line; an FP8 one
    sets `plugins.fp8` through `nemotron_h_fp8`); its evaluation (`evaluation`: the line setting
    its interval) and loss mask."""
    return bridge_optimizer() | bridge_eval_and_mask(f"{recipe}:{evaluation}") | {
        "precision.dtype": unpublished("bf16", f"{recipe}:{precision} ({precision_name})"),
        "plugins.fp8.format": unpublished(None, f"{recipe}:{precision} (bf16_mixed: no FP8)"),
        "train.global_batch_size": unpublished(768, f"{recipe}:{batch}"),
        "train.micro_batch_size": unpublished(1, f"{recipe}:{batch + 1}"),
        "scheduler.warmup_iters": unpublished(2000, f"{recipe}:{warmup}"),
        "train.train_iters": unpublished(1_168_251, f"{recipe}:{iters}",
                                         "a demo length: 7.35T tokens at 768 x 8192"),
    }


def tensor_parallel(size: int, where: str, sequence_parallel: bool = True) -> Settings:
    """The layout inside a node (Bridge's); data parallel fills the 64 GPUs."""
    layout = {"parallel.tensor": unpublished(size, where, "NVIDIA's layout unpublished; DP "
                                                          "fills 64 GPUs here (Bridge: 1 node)")}
    if sequence_parallel:
        layout["parallel.sequence_parallel"] = unpublished(True, where)
    return layout


def fp8_settings(fmt: Setting, recipe: Setting, where: str) -> Settings:
    """FP8 as NVIDIA pretrained Nemotron-H and Nano v2 (Bridge's precision recipe at `where`):
    the first and last 2 layers in BF16 (pattern symbols, `fp8_utils.py:673-689`: the first
    and last 4 GEMMs), FP8 parameters gathered in FP8."""
    return {
        "plugins.fp8.format": fmt,
        "plugins.fp8.recipe": recipe,
        "plugins.fp8.first_layers_bf16": unpublished(2, f"{where} (num_layers_at_start_in_bf16)",
                                                     "the Nano 2 report: the first and last "
                                                     "four matmuls in BF16 (2 pattern layers)"),
        "plugins.fp8.last_layers_bf16": unpublished(2, f"{where} (num_layers_at_end_in_bf16)"),
        "plugins.fp8.param_gather": unpublished(True, f"{where} (fp8_param_gather)"),
    }


def tp_overlap(where: str) -> Settings:
    """TP communication overlap as Bridge's recipe asks for it at `where`; Bridge keeps it on with
    TP >= 2 and sequence parallel (`COMM_OVERLAP`:442-451), which every recipe using this has."""
    return {"parallel.tp_comm_overlap": unpublished(True, f"{where}; {COMM_OVERLAP}:442-451")}


# Nemotron-H 47B/56B: Bridge's nemotron_h_bf16_with_fp8_current_scaling_mixed.
NEMOTRON_H_FP8 = f"{MIXED_PRECISION}:307-325"
NEMOTRON_H_FP8_NAME = "nemotron_h_bf16_with_fp8_current_scaling_mixed"


def nemotron_h_fp8(recipe: Setting) -> Settings:
    fmt = unpublished("hybrid", NEMOTRON_H_FP8, "E4M3 forward, E5M2 gradients")
    return fp8_settings(fmt, recipe, NEMOTRON_H_FP8)


# --- Nemotron-H ------------------------------------------------------------------------------

def not_pretrained(iters_line: int, recipe: str, how: str) -> Settings:
    """A model NVIDIA made by pruning and distillation: no published run to take a length from."""
    return {"train.train_iters": unpublished(1_168_251, f"{recipe}:{iters_line}",
                                             f"no published pretraining run: {how}")}


@sourced_recipe
def nemotron_h_4b_tp1_dp64() -> Settings:
    """Nemotron-H 4B (52 layers: 24 Mamba2, 4 attention, 24 MLP) on 64 GPUs, TP1 x DP64.

    NVIDIA did not pretrain this model: it was pruned and distilled from Nemotron-H 8B (380B
    tokens, its model card). This recipe trains its shape from scratch with Megatron Bridge's
    demo pretraining settings, marked as such.
    """
    return RUN_64GPU | nemotron_h_shape() | pattern(NEMOTRON_H_PATTERN, f"{H_PROVIDER}:64") | {
        "model.hidden_size": published(3072, f"{H_PROVIDER}:65"),
        "model.ffn_hidden_size": published(12288, f"{H_PROVIDER}:69"),
        "model.num_attention_heads": published(32, f"{H_PROVIDER}:70"),
        "model.kv_channels": published(128, f"{H_PROVIDER}:67"),
        "model.mamba_num_heads": published(112, f"{H_PROVIDER}:66"),
        "model.mamba_state_dim": published(128, f"{H_PROVIDER}:68"),
    } | bridge_run(H_RECIPE, 95, 104, 94, 97, 128) | tensor_parallel(1, f"{H_RECIPE}:72", False) \
        | not_pretrained(94, H_RECIPE, f"{H_4B_CARD}: pruned and distilled from Nemotron-H 8B "
                                       "with 380B tokens")


@sourced_recipe
def nemotron_h_8b_tp2_sp_dp32() -> Settings:
    """Nemotron-H 8B (52 layers, hidden 4096, 128 Mamba heads) on 64 GPUs, TP2 + SP x DP32.

    Its pretraining token count, optimizer and schedule are not published: Megatron Bridge's
    demo pretraining settings, marked as such.
    """
    return RUN_64GPU | nemotron_h_shape() | pattern(NEMOTRON_H_PATTERN, f"{H_PROVIDER}:78") | {
        "model.hidden_size": published(4096, f"{H_PROVIDER}:79"),
        "model.ffn_hidden_size": published(21504, f"{H_PROVIDER}:82"),
        "model.num_attention_heads": published(32, f"{H_PROVIDER}:83"),
        "model.mamba_num_heads": published(128, f"{H_PROVIDER}:81"),
        "model.mamba_state_dim": published(128, f"{H_PROVIDER}:80"),
    } | bridge_run(H_RECIPE, 227, 236, 226, 229, 260) | tensor_parallel(2, f"{H_RECIPE}:204, 209") \
        | tp_overlap(f"{H_RECIPE}:273-276")


@sourced_recipe
def nemotron_h_47b_tp8_sp_dp8() -> Settings:
    """Nemotron-H 47B (98 layers, hidden 8192, state 256) on 64 GPUs, TP8 + SP x DP8, FP8
    tensorwise with 2 + 2 BF16 end layers and FP8 parameters.

    NVIDIA did not pretrain this model: it was pruned and distilled from Nemotron-H 56B (63B
    tokens in FP8, its model card). This recipe trains its shape from scratch with Megatron
    Bridge's demo pretraining settings (Bridge's FP8 recipe), marked as such.
    """
    return RUN_64GPU | nemotron_h_shape() | pattern(NEMOTRON_H_47B_PATTERN,
                                                    f"{H_PROVIDER}:91") | {
        "model.hidden_size": published(8192, f"{H_PROVIDER}:93"),
        "model.ffn_hidden_size": published(30720, f"{H_PROVIDER}:96"),
        "model.num_attention_heads": published(64, f"{H_PROVIDER}:97"),
        "model.mamba_num_heads": published(256, f"{H_PROVIDER}:95"),
        "model.mamba_state_dim": published(256, f"{H_PROVIDER}:94"),
    } | bridge_run(H_RECIPE, 363, 372, 362, 365, 396, NEMOTRON_H_FP8_NAME) \
        | tensor_parallel(8, f"{H_RECIPE}:340, 345") \
        | tp_overlap(f"{H_RECIPE}:409-412") \
        | nemotron_h_fp8(unpublished("tensorwise", f"{H_RECIPE}:396; {NEMOTRON_H_FP8}",
                                     f"{H_47B_CARD}: distilled 'in FP8 precision'")) \
        | not_pretrained(362, H_RECIPE, f"{H_47B_CARD}: pruned and distilled from Nemotron-H "
                                        f"56B with 63B tokens ({H_PAGE})")


@sourced_recipe
def nemotron_h_56b_tp8_sp_dp8() -> Settings:
    """Nemotron-H 56B (118 layers, hidden 8192, state 256) pretraining on 64 GPUs: 20T tokens as
    published, FP8 tensorwise with 2 + 2 BF16 end layers and FP8 parameters, TP8 + SP x DP8.

    Published (Nemotron-H research page): 20T tokens in FP8 with per-tensor scaling on 6,144
    H100. Not published: the optimizer, schedule and batch, which are Megatron Bridge's.
    """
    return RUN_64GPU | nemotron_h_shape() | pattern(NEMOTRON_H_56B_PATTERN,
                                                    f"{H_PROVIDER}:105-106") | {
        "model.hidden_size": published(8192, f"{H_PROVIDER}:108"),
        "model.ffn_hidden_size": published(32768, f"{H_PROVIDER}:111"),
        "model.num_attention_heads": published(64, f"{H_PROVIDER}:112"),
        "model.mamba_num_heads": published(256, f"{H_PROVIDER}:110"),
        "model.mamba_state_dim": published(256, f"{H_PROVIDER}:109"),
    } | bridge_run(H_RECIPE, 500, 509, 499, 502, 533, NEMOTRON_H_FP8_NAME) \
        | tensor_parallel(8, f"{H_RECIPE}:477, 482") \
        | tp_overlap(f"{H_RECIPE}:546-549") | {
        "train.cuda_graphs": unpublished("transformer_engine", f"{H_PERF}:29-33, 68-72",
                                         "Bridge's H100 FP8 performance config"),
        "train.cuda_graph_modules": unpublished(["mamba"], f"{H_PERF}:68-72",
                                                "H100 FP8; its Blackwell configs: mamba, attn"),
    } \
        | nemotron_h_fp8(published("tensorwise", f"{H_PAGE}: FP8 'using per-tensor scaling'; "
                                                 f"{H_RECIPE}:533; {NEMOTRON_H_FP8}")) | {
        "train.train_iters": published(steps_for_tokens(20e12, 768, SEQ),
                                       f"{H_PAGE}: 20T tokens", "Bridge's demo: 1,168,251"),
        "cluster.nodes": differs(8, f"{H_PAGE}: 6,144 H100", "64 GPUs here: the same global "
                                                             "batch in more micro-batches"),
    }


# --- Nemotron Nano v2 --------------------------------------------------------------------------

@sourced_recipe
def nemotron_nano_v2_9b_tp2_sp_dp32() -> Settings:
    """Nemotron Nano v2 9B (56 layers, hidden 4480, Mamba heads of 80) on 64 GPUs, TP2 + SP.

    NVIDIA did not pretrain this model: it was pruned and distilled (Minitron) from the aligned
    Nano v2 12B; that run is not published. This recipe trains its shape from scratch with
    Megatron Bridge's demo pretraining settings, marked as such.
    """
    return RUN_64GPU | nemotron_h_shape() | pattern(NANO_V2_9B_PATTERN, f"{H_PROVIDER}:121") | {
        "model.hidden_size": published(4480, f"{H_PROVIDER}:122"),
        "model.ffn_hidden_size": published(15680, f"{H_PROVIDER}:126"),
        "model.num_attention_heads": published(40, f"{H_PROVIDER}:127"),
        "model.kv_channels": published(128, f"{H_PROVIDER}:124"),
        "model.mamba_num_heads": published(128, f"{H_PROVIDER}:123"),
        "model.mamba_head_dim": published(80, f"{H_PROVIDER}:128"),
        "model.mamba_state_dim": published(128, f"{H_PROVIDER}:125"),
        "model.vocab_size": published(131_072, f"{V2_9B_CONFIG}: vocab_size", secondary=True),
        "model.seq_length": unpublished(SEQ, f"{V2_RECIPE}:89 (the dataset's rows)",
                                        f"the 9B provider's 131,072 ({H_PROVIDER}:129, "
                                        f"{V2_RECIPE}:49) is the context it serves"),
    } | bridge_run(V2_RECIPE, 94, 103, 93, 96, 127) | tensor_parallel(2, f"{V2_RECIPE}:71, 76") \
        | tp_overlap(f"{V2_RECIPE}:140-143") \
        | not_pretrained(93, V2_RECIPE, f"{NANO2_REPORT}: pruned and distilled (Minitron) from "
                                        "the aligned Nano v2 12B")


NANO_V2_TOKENS, NANO_V2_DECAY_TOKENS = 20e12, 3.6e12
# Nano v2 12B: Bridge's nanov2_bf16_with_fp8_current_scaling_mixed.
NANO_V2_FP8 = f"{MIXED_PRECISION}:329-347"
NANO_V2_BATCH = 768


def nano_v2_12b() -> Settings:
    """Nemotron Nano v2 12B's shape and its published pretraining run (model card and report):
    20T tokens, WSD 4.5e-4 -> 4.5e-6 decaying over the final 3.6T, 8B warm-up tokens, FP8
    blockwise E4M3 with the first and last 4 matmuls in BF16."""
    steps = steps_for_tokens(NANO_V2_TOKENS, NANO_V2_BATCH, SEQ)
    return RUN_64GPU | nemotron_h_shape() | pattern(NANO_V2_12B_PATTERN,
                                                    f"{H_PROVIDER}:136") | {
        "model.num_layers": published(62, f"{NANO2_CARD} (62 layers: 28 Mamba-2, 28 MLP, 6 "
                                          f"attention); the length of {H_PROVIDER}:136"),
        "model.hidden_size": published(5120, f"{H_PROVIDER}:137; {NANO2_REPORT}"),
        "model.ffn_hidden_size": published(20480, f"{H_PROVIDER}:141; {NANO2_REPORT}"),
        "model.num_attention_heads": published(40, f"{H_PROVIDER}:142"),
        "model.kv_channels": published(128, f"{H_PROVIDER}:139"),
        "model.mamba_num_heads": published(128, f"{H_PROVIDER}:138"),
        "model.mamba_head_dim": published(80, f"{H_PROVIDER}:143",
                                          "a digest of the report's Table 1 reads 64, which "
                                          "128 heads x 64 cannot fill (2 x 5120)"),
        "model.mamba_state_dim": published(128, f"{H_PROVIDER}:140"),
        "model.vocab_size": published(131_072, f"{V2_9B_CONFIG} (the same tokenizer)",
                                      secondary=True),
        "model.seq_length": published(SEQ, f"{V2_RECIPE}:224; {NANO2_REPORT}, §2.5"),
        "train.global_batch_size": published(NANO_V2_BATCH, f"{NANO2_REPORT}, §2.5; "
                                                            f"{V2_RECIPE}:229",
                                             "the card says 736, and the report's own 6,029,312 "
                                             "tokens a batch are 736 x 8192", secondary=True),
        "train.micro_batch_size": unpublished(1, f"{V2_RECIPE}:230"),
        "train.train_iters": published(steps, f"{NANO2_CARD}: 20T tokens",
                                       "Bridge's demo: 1,168,251"),
        "optimizer.lr": published(4.5e-4, NANO2_CARD, "Bridge's demo: 3e-4"),
        "optimizer.min_lr": published(4.5e-6, NANO2_CARD, "Bridge's demo: 3e-5"),
        "scheduler.style": published("wsd", NANO2_CARD, "Bridge's demo: cosine"),
        "scheduler.warmup_iters": published(steps_for_tokens(8e9, NANO_V2_BATCH, SEQ),
                                            f"{NANO2_CARD}: 8B warm-up tokens",
                                            "Bridge's demo: 2,000 steps"),
        "scheduler.wsd_decay_iters": published(
            steps_for_tokens(NANO_V2_DECAY_TOKENS, NANO_V2_BATCH, SEQ),
            f"{NANO2_REPORT}, §2.5: decayed over the final 3.6T tokens", secondary=True),
        "scheduler.wsd_decay_style": unpublished(
            "minus_sqrt", f"{BRIDGE_OPTIMIZER}:167 (lr_wsd_decay_style, the optimizer helper "
                          "the Nano v2 recipe builds with)",
            "Nano v2's decay shape is not published; NVIDIA's Nemotron 3 Super configs use "
            f"minus-sqrt too ({SUPER_PHASE1}:25-31)"),
        "optimizer.weight_decay": published(0.1, f"{NANO2_REPORT}, §2.5", BRIDGE_WEIGHT_DECAY,
                                            secondary=True),
        "optimizer.adam_beta1": published(0.9, f"{NANO2_REPORT}, §2.5", secondary=True),
        "optimizer.adam_beta2": published(0.95, f"{NANO2_REPORT}, §2.5", secondary=True),
        "optimizer.adam_eps": unpublished(1e-8, f"{BRIDGE_OPTIMIZER}:114"),
        "optimizer.clip_grad": unpublished(1.0, f"{BRIDGE_OPTIMIZER}:118"),
        "precision.dtype": published("bf16", f"{NANO2_REPORT}: BF16 beside FP8; "
                                             f"{V2_RECIPE}:262", secondary=True),
    } | bridge_eval_and_mask(f"{V2_RECIPE}:231") | tensor_parallel(4, f"{V2_RECIPE}:206, 211") \
        | fp8_settings(
        published("e4m3", f"{NANO2_REPORT}: E4M3 for all tensors",
                  f"Bridge's nanov2 precision recipe: hybrid, E5M2 gradients ({NANO_V2_FP8})",
                  secondary=True),
        published("blockwise", f"{NANO2_REPORT}: 128 x 128 weight and 1 x 128 activation "
                               f"blocks; {V2_RECIPE}:262; {NANO_V2_FP8}", secondary=True),
        NANO_V2_FP8)


@sourced_recipe
def nemotron_nano_v2_12b_tp4_sp_dp16() -> Settings:
    """Nemotron Nano v2 12B (62 layers, hidden 5120, Mamba heads of 80) pretraining as published
    on 64 GPUs, TP4 + SP x DP16: 20T tokens, WSD 4.5e-4 -> 4.5e-6 over the final 3.6T, FP8
    blockwise (E4M3) with 2 + 2 BF16 end layers, one blend (the phased recipe has the
    report's three data phases and long-context phase)."""
    return nano_v2_12b()


NANO_V2_LC_TOKENS, NANO_V2_LC_BATCH = 18.9e9, 12


@sourced_recipe
def nemotron_nano_v2_12b_phases_tp4_sp_dp16() -> Settings:
    """Nemotron Nano v2 12B pretraining in its reported phases on 64 GPUs: three data phases
    switching at 60% and 90% of 20T tokens (the WSD decay over the final 3.6T), then the
    long-context phase at 512k tokens a sequence with CP16.

    Published (the report, read through summaries): phase 1 promotes diversity, phases 2 and 3
    use high-quality data; the long-context phase trains 18.9B tokens of 524,288-token
    sequences, 12 a step, at a constant 4.5e-6 on TP8 x CP16, its blend phase 3's scaled to 80%
    plus 20% long-document QA. Here the long-context phase runs on TP4 x CP16 (64 GPUs) and the
    blends (conf/data/nemotron_*.yaml) are examples whose paths you replace.
    """
    pretrain = steps_for_tokens(NANO_V2_TOKENS, NANO_V2_BATCH, SEQ)
    long = steps_for_tokens(NANO_V2_LC_TOKENS, NANO_V2_LC_BATCH, LONG_SEQ)
    switch = NANO2_REPORT + ", §2.2: phases switch at 60% and 90% of training"
    example = "weights unpublished: an example blend to replace"
    return nano_v2_12b() | {
        "train.train_iters": published(pretrain + long, f"{NANO2_CARD}: 20T tokens; "
                                                        f"{NANO2_REPORT}, §2.6: 18.9B "
                                                        "long-context tokens"),
        "scheduler.decay_iters": published(pretrain, f"{NANO2_REPORT}, §2.6: the long-context "
                                                     "phase holds a constant 4.5e-6 (min_lr "
                                                     "after the decay ends)", secondary=True),
        "checkpoint.optimizer_format": ours("fully_reshardable", "the CP16 relaunch resumes "
                                                                 "the CP1 optimizer state"),
        "data.source": ours("blend", "prepared data named by the phases' blends"),
        "data.blend": ours("conf/data/nemotron_h_general.yaml", example),
        "phases[0]": published(PhaseConfig(name="diverse", end_step=round(0.6 * pretrain),
                                           seq_length=SEQ), switch, example, secondary=True),
        "phases[1]": published(PhaseConfig(name="quality", end_step=round(0.9 * pretrain),
                                           seq_length=SEQ,
                                           blend="conf/data/nemotron_h_quality.yaml"),
                               switch, example, secondary=True),
        "phases[2]": published(PhaseConfig(name="quality_final", end_step=pretrain,
                                           seq_length=SEQ), switch, example, secondary=True),
        "phases[3]": differs(PhaseConfig(name="long_context", end_step=pretrain + long,
                                         seq_length=LONG_SEQ, context=16,
                                         global_batch_size=NANO_V2_LC_BATCH,
                                         blend="conf/data/nemotron_nano_v2_long_context.yaml",
                                         relaunch=True),
                             f"{NANO2_REPORT}, §2.6 (512k sequences, 12 a step, TP8 x CP16, "
                             "18.9B tokens, concatenated and chunked)",
                             "TP4 x CP16 on 64 GPUs (published TP8 x CP16)"),
    }


# --- Nemotron 3 Nano ------------------------------------------------------------------------

def nemotron3_router() -> Settings:
    """Nemotron 3's routed MLPs: sigmoid scores with the aux-loss-free expert bias, a small
    per-sequence balance loss, the router in fp32."""
    return {
        "model.moe_router_score_function": published("sigmoid", f"{N3_PROVIDER}:49; "
                                                                f"{N3_ARCHITECTURE}:91"),
        "model.moe_router_expert_bias": published(True, f"{N3_PROVIDER}:50; {N3_PAPER}:81-84"),
        "model.moe_router_bias_update_rate": published(
            1e-3, f"{N3_REPORT}: 'an update rate of 10^-3'; {MEGATRON_CORE}/transformer/"
                  "transformer_config.py:800 (Megatron's default, which Bridge keeps)"),
        "model.moe_load_balancing": unpublished("seq_aux_loss", f"{N3_PROVIDER}:51"),
        "model.moe_aux_loss_coeff": published(1e-4, f"{N3_REPORT}: 'a load balancing loss "
                                                    f"coefficient of 10^-4'; {N3_PROVIDER}:48"),
        "model.moe_router_fp32": unpublished(True, f"{N3_PROVIDER}:52"),
    }


def nemotron3_moe(model: ModelConfig, experts: int, topk: int, width: int, shared: int,
                  scaling: float) -> ModelConfig:
    """`model` with Nemotron 3's routed MLPs of these sizes (the tiny hybrids' too)."""
    router = build(nemotron3_router()).model
    for key in nemotron3_router():
        name = key.split(".")[1]
        setattr(model, name, getattr(router, name))
    model.num_moe_experts, model.moe_router_topk = experts, topk
    model.moe_ffn_hidden_size, model.moe_shared_expert_ffn_hidden_size = width, shared
    model.moe_router_topk_scaling_factor = scaling
    # Grouped-GEMM experts: what Megatron's hybrid layers build on Transformer Engine (CPU ranks
    # run without it).
    model.moe_grouped_gemm = True
    return model


def nemotron3_fast_paths() -> Settings:
    """The GPU fast paths of Bridge's Nemotron 3 Nano recipe and its H100 BF16 performance
    config: HybridEP's flex dispatcher, grouped-GEMM experts with fused permutation and fused
    weighted squared ReLU, TP overlap, Transformer Engine's graphs of attention and Mamba, and
    selective recompute of the MoE layers and norms."""
    perf = "Bridge's H100 BF16 performance config"
    return {
        "model.moe_token_dispatcher": unpublished("flex", f"{N3_RECIPE_NOW}:105; {N3_PERF}:31-40"),
        "model.moe_flex_backend": unpublished("hybridep", f"{N3_PERF}:37",
                                              f"the recipe: deepep ({N3_RECIPE_NOW}:106)"),
        "model.moe_grouped_gemm": unpublished(True, f"{N3_RECIPE_NOW}:128"),
        "model.moe_permute_fusion": unpublished(True, f"{N3_RECIPE_NOW}:127"),
        "model.moe_fused_squared_relu": unpublished(True, f"{N3_RECIPE_NOW}:190 "
                                                          "(use_fused_weighted_squared_relu)"),
        "parallel.tp_comm_overlap": unpublished(True, f"{N3_RECIPE_NOW}:163-166; "
                                                      f"{COMM_OVERLAP}:442-451"),
        "train.cuda_graphs": unpublished("transformer_engine", f"{N3_PERF}:74-80", perf),
        "train.cuda_graph_modules": unpublished(["attn", "mamba"], f"{N3_PERF}:82-86", perf),
        "train.recompute": unpublished("selective", f"{N3_PERF}:82-86", perf),
        "train.recompute_modules": unpublished(["moe", "layernorm"], f"{N3_PERF}:84", perf),
    }


NANO3_BATCH, NANO3_TOKENS, NANO3_DECAY_TOKENS = 3072, 25e12, 5e12


def nemotron3_nano() -> Settings:
    """Nemotron 3 Nano 30B-A3B and its published pretraining run (model card, NVIDIA's docs):
    25T tokens, WSD 1e-3 -> 1e-5 with the decay over the final 5T, batch 3072 x 8k."""
    steps = steps_for_tokens(NANO3_TOKENS, NANO3_BATCH, SEQ)
    return RUN_64GPU | nemotron_h_shape() | pattern(NEMOTRON3_NANO_PATTERN,
                                                    f"{N3_PROVIDER}:158") | {
        "model.hidden_size": published(2688, f"{N3_PROVIDER}:160; {N3_ARCHITECTURE}:37"),
        "model.ffn_hidden_size": published(1856, f"{N3_PROVIDER}:164 (no dense MLP layer)"),
        "model.num_attention_heads": published(32, f"{N3_PROVIDER}:165; {N3_ARCHITECTURE}:38"),
        "model.num_query_groups": published(2, f"{N3_PROVIDER}:157; {N3_ARCHITECTURE}:39"),
        "model.kv_channels": published(128, f"{N3_PROVIDER}:162; {N3_ARCHITECTURE}:40"),
        "model.mamba_num_heads": published(64, f"{N3_PROVIDER}:161; {N3_ARCHITECTURE}:43"),
        "model.mamba_head_dim": published(64, f"{N3_PROVIDER}:166; {N3_ARCHITECTURE}:44"),
        SOFTMAX: unpublished(False, f"{N3_PROVIDER}:43", SOFTMAX_NOTE),
        "model.seq_length": published(SEQ, f"{N3_PAPER}:13, 73; {N3_RECIPE}:133",
                                      "the model's context is 1M; 8k is the training length"),
        "model.mamba_state_dim": published(128, f"{N3_PROVIDER}:163; {N3_ARCHITECTURE}:41"),
        "model.vocab_size": published(131_072, f"{N3_CONFIG}: vocab_size", secondary=True),
        "model.num_moe_experts": published(128, f"{N3_PROVIDER}:167; {N3_ARCHITECTURE}:45"),
        "model.moe_router_topk": published(6, f"{N3_PROVIDER}:170; {N3_ARCHITECTURE}:46"),
        "model.moe_ffn_hidden_size": published(1856, f"{N3_PROVIDER}:168; "
                                                     f"{N3_ARCHITECTURE}:47"),
        "model.moe_shared_expert_ffn_hidden_size": published(
            3712, f"{N3_PROVIDER}:169; {N3_CONFIG}", "the report: 2 shared experts (2 x 1856, "
            "the same weights); the model card: 1 shared expert (of width 3712, the same)"),
        "model.moe_router_topk_scaling_factor": published(2.5, f"{N3_PROVIDER}:171; "
                                                               f"{N3_CONFIG}"),
        "model.init_method_std": unpublished(0.0173, f"{N3_RECIPE}:219",
                                             "the HF config's initializer_range 0.02 is not "
                                             "the pretraining value"),
        "train.global_batch_size": published(NANO3_BATCH, f"{N3_PAPER}:74-75; {N3_DOCS}:100"),
        "train.micro_batch_size": unpublished(2, f"{N3_RECIPE}:132"),
        "train.train_iters": published(steps, f"{N3_CARD}: 25T tokens; {N3_DOCS}:99",
                                       "Bridge's demo: 39,735 (1T)"),
        "optimizer.lr": published(1e-3, f"{N3_CARD}; {N3_DOCS}:102", "Bridge's demo recipe "
                                  f"(run by NVIDIA's stage-0 config): 1.6e-3, {N3_RECIPE}:137"),
        "optimizer.min_lr": published(1e-5, f"{N3_CARD}; {N3_DOCS}:103",
                                      f"Bridge's demo: 1.6e-5, {N3_RECIPE}:138"),
        "scheduler.style": published("wsd", f"{N3_PAPER}:81-97; {N3_DOCS}:108-116",
                                     f"Bridge's demo: cosine over 1T, {N3_RECIPE}:240"),
        "scheduler.warmup_iters": published(333, f"{N3_DOCS}:112 (8.4B tokens); "
                                                 f"{N3_RECIPE}:139",
                                            "the card: 8B tokens (318 steps)"),
        "scheduler.wsd_decay_iters": published(
            steps_for_tokens(NANO3_DECAY_TOKENS, NANO3_BATCH, SEQ),
            f"{N3_PAPER}:81-97; {N3_DOCS}:108-116: decay over the final 5T (20%) of 25T"),
        "scheduler.wsd_decay_style": published("cosine", f"{N3_DOCS}:116 ('before cosine "
                                                         "decay')", "NVIDIA's docs only"),
        "optimizer.weight_decay": published(0.1, f"{N3_DOCS}:105",
                                            "Bridge as released applied 0.1 too (start/end "
                                            f"0.1, {N3_RECIPE}:238-239); later Bridge 0.033"),
        "optimizer.adam_beta1": published(0.9, f"{N3_DOCS}:104; {N3_RECIPE}:232"),
        "optimizer.adam_beta2": published(0.95, f"{N3_DOCS}:104; {N3_RECIPE}:233"),
        "optimizer.adam_eps": unpublished(1e-8, f"{N3_RECIPE}:234"),
        "optimizer.clip_grad": unpublished(1.0, f"{BRIDGE_OPTIMIZER}:118"),
        "data.eod_mask_loss": unpublished(False, f"{N3_RECIPE}:272", EOD_NOTE),
        "train.eval_interval": unpublished(1000, f"{N3_RECIPE}:134"),
        "train.eval_iters": unpublished(32, f"{N3_RECIPE}:255"),
        "precision.dtype": unpublished("bf16", f"{N3_RECIPE}:101 (bf16_mixed)"),
        "plugins.fp8.format": unpublished(None, f"{N3_RECIPE}:101 (bf16_mixed: no FP8)"),
        "parallel.tensor": differs(4, f"{N3_DOCS}:364-370 (TP8, EP8)",
                                   f"Bridge's TP4 + SP ({N3_RECIPE}:93), kept for 64 GPUs"),
        "parallel.sequence_parallel": published(True, f"{N3_DOCS}:364-370; {N3_RECIPE}:97"),
        "parallel.expert": published(8, f"{N3_DOCS}:364-370; {N3_RECIPE}:100"),
        "parallel.expert_tensor": unpublished(1, f"{N3_RECIPE}:99"),
    } | nemotron3_router() | nemotron3_fast_paths()


@sourced_recipe
def nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16() -> Settings:
    """Nemotron 3 Nano 30B-A3B pretraining as published on 64 GPUs: TP4 + SP x DP16, experts
    EP8; 25T tokens of 8k sequences, batch 3072, WSD 1e-3 -> 1e-5 decaying (cosine) over the
    final 5T, one blend (the phased recipe has the report's two data phases and long-context
    phase)."""
    return nemotron3_nano()


NANO3_QUALITY_TOKENS = 1.5e12
NANO3_LC_TOKENS, NANO3_LC_BATCH = 121e9, 48


@sourced_recipe
def nemotron3_nano_30b_a3b_phases_tp4_sp_ep8_dp16() -> Settings:
    """Nemotron 3 Nano 30B-A3B pretraining in its reported phases on 64 GPUs: 23.5T diverse
    tokens, 1.5T high-quality tokens (WSD's decay over the final 5T, from 20T), then a
    long-context phase of 121B tokens at a constant 1e-5 whose packed 512k-token rows mix long
    and short documents, with CP16 (EP8 kept).

    Published (the report as NVIDIA's docs and summary give it; model card): the long-context
    phase trains 512k sequences mixed with 4k ones, since 512k alone hurt short-context scores,
    at global batch 48 on TP8 x PP4 x CP8 x EP8. Here each 512k row packs whole documents of the
    long-context blend, each document attending to itself (`docs/phases.md`): the mix of long
    and short documents is the blend's; the layout is TP4 x CP16 x EP8 on 64 GPUs. The blends
    (conf/data/nemotron*.yaml) are examples whose paths you replace.
    """
    steps = steps_for_tokens(NANO3_TOKENS, NANO3_BATCH, SEQ)
    general = steps_for_tokens(NANO3_TOKENS - NANO3_QUALITY_TOKENS, NANO3_BATCH, SEQ)
    long = steps_for_tokens(NANO3_LC_TOKENS, NANO3_LC_BATCH, LONG_SEQ)
    example = "weights published only as a figure: an example blend to replace"
    return nemotron3_nano() | {
        "train.train_iters": published(steps + long, f"{N3_CARD}: 25T tokens; {N3_PAPER}:138, "
                                                     f"{N3_DOCS}:149: 121B long-context tokens"),
        "scheduler.decay_iters": published(steps, f"{N3_DOCS}:150: the long-context phase "
                                                  "holds a constant 1e-5, the min lr after "
                                                  "the decay"),
        "checkpoint.optimizer_format": ours("fully_reshardable", "the CP16 relaunch resumes "
                                                                 "the CP1 optimizer state"),
        "data.source": ours("blend", "prepared data named by the phases' blends"),
        "data.blend": ours("conf/data/nemotron_h_general.yaml", example),
        "data.eod_mask_loss": differs(True, f"{N3_RECIPE}:272 (false)",
                                      "the long-context phase's packed rows need it (no label "
                                      "may cross a document); one setting for every phase"),
        "train.cuda_graphs": differs("none", f"{N3_PERF}:74-80 (transformer_engine)",
                                     "the long-context phase's packed rows cannot replay TE's "
                                     "graphs of attention and Mamba (Megatron asserts); a phase "
                                     "cannot change the graphs, so none in every phase"),
        "train.cuda_graph_modules": differs([], f"{N3_PERF}:82-86 ([attn, mamba])",
                                            "no graphs (train.cuda_graphs)"),
        "phases[0]": published(PhaseConfig(name="general", end_step=general, seq_length=SEQ,
                                           documents="concatenate"),
                               f"{N3_PAPER}:40-52; {N3_DOCS}:74-91: 23.5T tokens for "
                               "diversity", example),
        "phases[1]": published(PhaseConfig(name="quality", end_step=steps, seq_length=SEQ,
                                           documents="concatenate",
                                           blend="conf/data/nemotron_h_quality.yaml"),
                               f"{N3_PAPER}:40-52; {N3_DOCS}:74-91: 1.5T high-quality tokens",
                               example),
        "phases[2]": differs(PhaseConfig(name="long_context", end_step=steps + long,
                                         seq_length=LONG_SEQ, context=16,
                                         global_batch_size=NANO3_LC_BATCH, documents="packed",
                                         micro_batch_size=1,
                                         blend="conf/data/nemotron3_nano_long_context.yaml",
                                         relaunch=True),
                             f"{N3_PAPER}:130-174; {N3_DOCS}:149-152 (121B tokens, batch 48, "
                             "512k sequences mixed with 4k ones, TP8 x PP4 x CP8 x EP8)",
                             "TP4 x CP16 x EP8 on 64 GPUs; the 512k/4k mix as packed rows of "
                             "whole documents (ratio unpublished: the blend's)"),
    }


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
