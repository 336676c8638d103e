"""Nemotron-4 15B as NVIDIA pretrained it, on 64 GPUs: every setting beside its source.

The shape is Megatron Bridge's Nemotron-4 provider (the report's Table 1 for what it states):
squared-ReLU MLPs, LayerNorm with a zero-centred gamma (LayerNorm1p), RoPE over half of each
head, GQA 48/8, no biases, untied embeddings, the 256k vocabulary. The run is the report's
Table 2: 8T tokens of 4096-token sequences with the batch ramping 384 -> 768 -> 1152. The
report publishes no optimizer setting; Bridge has no Nemotron-4 recipe, so those are Megatron
Bridge's defaults for a pretraining recipe (`_pretrain_common`), and NeMo's Nemotron-4 template
is named beside them. `docs/nemotron.md` lists them all, generated from these tables.
"""

from __future__ import annotations

from recipes.base_64gpu import RUN_64GPU
from recipes.config.rampup import ramp_schedule, ramp_steps, samples_after
from recipes.config.schema import ModelConfig, PhaseConfig
from recipes.nemotron.citations import (
    BRIDGE_COMMON,
    BRIDGE_OPTIMIZER,
    BRIDGE_WEIGHT_DECAY,
    GPT_PROVIDER,
    N4_PROVIDER,
    N4_REPORT,
    N340B_REPORT,
    NEMO_N4_TEMPLATE,
    SOFTMAX_NOTE,
)
from recipes.sources import (
    Settings,
    build,
    differs,
    ours,
    published,
    sourced_recipe,
    steps_for_tokens,
    unpublished,
)

SEQ = 4096
BATCH = 1152  # the full batch; the ramp starts at 384 and adds 384
RAMP_TOKENS = 0.4e12  # 0.2T at 384, 0.2T at 768
PRETRAIN_TOKENS, CONTINUED_TOKENS = 8e12, 1e12


def nemotron4_15b_shape() -> Settings:
    """The Nemotron-4 15B model (Bridge's provider; the report's Table 1 where it says)."""
    return {
        "model.num_layers": published(32, f"{N4_PROVIDER}:124; {N4_REPORT}, Table 1"),
        "model.hidden_size": published(6144, f"{N4_PROVIDER}:126; {N4_REPORT}, Table 1"),
        "model.ffn_hidden_size": published(24576, f"{N4_PROVIDER}:127"),
        "model.num_attention_heads": published(48, f"{N4_PROVIDER}:128; {N4_REPORT}, Table 1"),
        "model.num_query_groups": published(8, f"{N4_PROVIDER}:129; {N4_REPORT}, Table 1"),
        "model.kv_channels": published(None, f"{N4_PROVIDER}:130 (None: hidden / heads = 128)"),
        "model.seq_length": published(SEQ, f"{N4_PROVIDER}:125; {N4_REPORT}, Table 1"),
        "model.vocab_size": published(256_000, f"{N4_REPORT}, Table 1", secondary=True),
        "model.activation": published("squared_relu", f"{N4_PROVIDER}:38; {N4_REPORT}, §2"),
        "model.normalization": published("LayerNorm", f"{N4_PROVIDER}:37"),
        "model.layernorm_zero_centered_gamma": published(True, f"{N4_PROVIDER}:49"),
        "model.position_embedding": published("rope", f"{N4_PROVIDER}:39; {N4_REPORT}, §2"),
        "model.rotary_percent": published(0.5, f"{N4_PROVIDER}:45"),
        "model.rotary_base": unpublished(10_000, f"{GPT_PROVIDER}:138 (Bridge's default, not "
                                                 "overridden for Nemotron-4)"),
        "model.add_bias_linear": published(False, f"{N4_PROVIDER}:41; {N4_REPORT}, §2"),
        "model.share_embeddings_and_output_weights": published(
            False, f"{N4_PROVIDER}:40; {N4_REPORT}, §2"),
        "model.hidden_dropout": published(0.0, f"{N4_PROVIDER}:43; {N4_REPORT}, §2"),
        "model.attention_dropout": published(0.0, f"{N4_PROVIDER}:44"),
        "model.attention_softmax_in_fp32": unpublished(
            False, f"{GPT_PROVIDER}:145 (Bridge's default, not overridden for Nemotron-4)",
            SOFTMAX_NOTE),
        "model.init_method_std": unpublished(0.0134, f"{N4_PROVIDER}:131",
                                             "also NVIDIA's NeMo launcher config for 15B"),
    }


def nemotron4_15b_model() -> ModelConfig:
    """The Nemotron-4 15B model alone."""
    return build(nemotron4_15b_shape()).model


def nemotron4_15b_training() -> Settings:
    """The report's batch and token budget; Bridge's pretraining defaults for what it does
    not publish."""
    ramp = round(RAMP_TOKENS / SEQ)
    return {
        "train.global_batch_size": published(BATCH, f"{N4_REPORT}, Table 2"),
        "train.rampup_batch_size": published(
            [384, 384, ramp], f"{N4_REPORT}, Table 2 (384 -> 768 -> 1152 sequences, 0.2T tokens "
            "at each of the first two)", "grown per 0.2T tokens, as Megatron-LM's "
            "--rampup-batch-size writes it", secondary=True),
        "train.micro_batch_size": unpublished(2, f"{NEMO_N4_TEMPLATE} (micro_batch_size=2)"),
        "train.train_iters": published(pretrain_steps(), f"{N4_REPORT}: 8T tokens (abstract, "
                                                         "Table 2)", secondary=True),
        "optimizer.lr": unpublished(3e-4, f"{BRIDGE_COMMON}:56", "NeMo's Nemotron-4 template: "
                                    f"4.5e-5 ({NEMO_N4_TEMPLATE}); the report gives none"),
        "optimizer.min_lr": unpublished(3e-5, f"{BRIDGE_COMMON}:57",
                                        f"NeMo's template: 4.5e-5 ({NEMO_N4_TEMPLATE})"),
        "scheduler.style": unpublished("cosine", f"{BRIDGE_OPTIMIZER}:122"),
        "scheduler.warmup_iters": unpublished(500, f"{BRIDGE_COMMON}:54",
                                              f"NeMo's template: 500 too ({NEMO_N4_TEMPLATE})"),
        "optimizer.weight_decay": unpublished(0.1, f"{BRIDGE_OPTIMIZER}:108-123",
                                              BRIDGE_WEIGHT_DECAY),
        "optimizer.adam_beta1": unpublished(0.9, f"{BRIDGE_OPTIMIZER}:112"),
        "optimizer.adam_beta2": unpublished(0.95, f"{BRIDGE_OPTIMIZER}:113"),
        "optimizer.adam_eps": unpublished(1e-8, f"{BRIDGE_OPTIMIZER}:114"),
        "optimizer.clip_grad": unpublished(1.0, f"{BRIDGE_OPTIMIZER}:118",
                                           f"NeMo's template: 1.0 ({NEMO_N4_TEMPLATE})"),
        "data.eod_mask_loss": unpublished(False, f"{BRIDGE_COMMON}:94",
                                          "this project's default is true (no loss where the "
                                          "input is the end-of-document token)"),
        "train.eval_interval": unpublished(500, f"{BRIDGE_COMMON}:73",
                                           f"NeMo's template: 2,000 ({NEMO_N4_TEMPLATE})"),
        "train.eval_iters": unpublished(32, f"{BRIDGE_COMMON}:74",
                                        f"NeMo's template: 32 too ({NEMO_N4_TEMPLATE})"),
        "precision.dtype": unpublished("bf16", f"{N4_PROVIDER}:64-67"),
        "plugins.fp8.format": unpublished(None, f"{N4_PROVIDER}:64-67 (bf16, no FP8)"),
        "parallel.tensor": published(8, f"{N4_REPORT}, Table 2 (8-way tensor parallelism)",
                                     secondary=True),
        "parallel.sequence_parallel": ours(True, "sequence parallelism with TP8, as NVIDIA's "
                                                 "NeMo launcher config for 15B"),
        "cluster.nodes": differs(8, f"{N4_REPORT}, Table 2 (768, then 1,536, then 2,304 H100)",
                                 "64 GPUs here: the same batches in more micro-batches"),
        "parallel.pipeline": differs(2, f"{N4_REPORT}, Table 2 (TP8 x DP96-288 on 768-2,304 "
                                        "H100, no PP)", "re-cut for 64 GPUs: 16 layers a stage "
                                     "x DP4 (the report grows DP with the batch; here the "
                                     "micro-batches per step grow)"),
    }


def pretrain_steps() -> int:
    """Steps for the report's 8T tokens through its batch ramp-up (the schedule counts the
    ramp's smaller batches, `recipes/config/rampup.py`)."""
    cfg = build({"train.global_batch_size": published(BATCH, N4_REPORT),
                 "train.rampup_batch_size": published([384, 384, round(RAMP_TOKENS / SEQ)],
                                                      N4_REPORT)})
    schedule = ramp_schedule(cfg)
    ramp = ramp_steps(schedule)
    return ramp + steps_for_tokens(PRETRAIN_TOKENS - samples_after(schedule, ramp) * SEQ,
                                   BATCH, SEQ)


@sourced_recipe
def nemotron4_15b_tp8_pp2_dp4() -> Settings:
    """Nemotron-4-15B pretraining as reported (8T tokens, batch ramp 384 -> 768 -> 1152) on 64
    GPUs: TP8 + SP in a node x PP2 (16 layers a stage) x DP4.

    LayerNorm1p needs Transformer Engine's norms (GPU ranks); the optimizer and schedule are
    not published and are Megatron Bridge's pretraining defaults (NeMo's template beside them).
    """
    return RUN_64GPU | nemotron4_15b_shape() | nemotron4_15b_training()


@sourced_recipe
def nemotron4_15b_phases_tp8_pp2_dp4() -> Settings:
    """Nemotron-4-15B pretraining in its reported phases on 64 GPUs (TP8 + SP x PP2 x DP4): 8T
    tokens with the batch ramp-up, then a continued-training phase with its own blend and a
    steeper learning-rate decay.

    After pretraining the report switches the data distribution and decays the learning rate
    more steeply. Not published for 15B: the continued phase's length, blend weights and decay
    shape. Its length here is the Nemotron-4 340B report's 1T continued tokens (the same
    procedure after 8T); its blends (conf/data/nemotron4_*.yaml) are examples whose paths and
    weights you replace; the learning rate holds through pretraining and decays over the
    continued phase (WSD).
    """
    pretrain = pretrain_steps()
    total = pretrain + steps_for_tokens(CONTINUED_TOKENS, BATCH, SEQ)
    return RUN_64GPU | nemotron4_15b_shape() | nemotron4_15b_training() | {
        "train.train_iters": differs(total, f"{N4_REPORT}: 8T pretraining tokens; "
                                            f"{N340B_REPORT}: 1T continued tokens",
                                     "15B's continued length is unpublished: 340B's 1T",
                                     ),
        "scheduler.style": ours("wsd", f"{N4_REPORT}, continued training: 'a steeper slope of "
                                       "decay' (no shape or values): the stable lr through "
                                       "pretraining, the whole decay over the continued phase"),
        "scheduler.wsd_decay_style": ours("linear", "the report gives no shape: this "
                                                    "project's WSD default (Megatron-LM's is "
                                                    "exponential)"),
        "data.source": ours("blend", "prepared data named by the phases' blends"),
        "data.blend": ours("conf/data/nemotron4_pretraining.yaml",
                           "an example: the report's 70% English, 15% multilingual, 15% code "
                           "split into example sources; replace paths and weights"),
        "phases[0]": published(PhaseConfig(name="pretraining", end_step=pretrain),
                               f"{N4_REPORT}: 8T tokens before continued training",
                               secondary=True),
        "phases[1]": differs(PhaseConfig(name="continued", end_step=total,
                                         blend="conf/data/nemotron4_continued.yaml",
                                         lr_decay=True),
                             f"{N4_REPORT}, continued training (higher-quality sources plus "
                             "benchmark-style alignment examples)",
                             "blend weights unpublished: an example file to replace"),
    }


RECIPES = (nemotron4_15b_tp8_pp2_dp4, nemotron4_15b_phases_tp8_pp2_dp4)
