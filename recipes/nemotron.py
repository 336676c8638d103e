"""Nemotron-4 family: the 15B shape (squared-ReLU MLP, 256k vocabulary) on 64 GPUs, and its
pretraining as reported: a batch ramp-up and a final switch to a continued-training blend."""

from __future__ import annotations

import math

from recipes.base_64gpu import large_run_base
from recipes.config.phases import PhaseConfig
from recipes.config.rampup import ramp_schedule, ramp_steps, samples_after
from recipes.config.schema import ModelConfig, ParallelConfig, RunConfig


def nemotron4_15b_model() -> ModelConfig:
    """Nemotron-4-15B shape: GQA 48/8, squared-ReLU MLP, LayerNorm, no bias, untied, 256k vocab."""
    return ModelConfig(
        num_layers=32,
        hidden_size=6144,
        ffn_hidden_size=24576,
        num_attention_heads=48,
        num_query_groups=8,
        seq_length=4096,
        vocab_size=256_000,
        activation="squared_relu",
        normalization="LayerNorm",
        position_embedding="rope",
        rotary_base=10_000,
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        init_method_std=0.0134,
    )


def nemotron4_15b_tp8_pp2_dp4() -> RunConfig:
    """Nemotron-4-15B on 64 GPUs: TP8 + SP in a node x PP2 (16 layers per stage) x DP4."""
    cfg = large_run_base(nemotron4_15b_model(), lr=4.5e-4)
    cfg.parallel = ParallelConfig(tensor=8, pipeline=2, sequence_parallel=True)
    cfg.train.global_batch_size = 384  # Nemotron-4's starting batch: 1.5M tokens at 4k
    return cfg


SEQ_4K = 4096
PRETRAIN_TOKENS = 8e12  # Nemotron-4 15B report: pretrained on 8T tokens
CONTINUED_TOKENS = 1e12  # the 340B report's continued phase (see the recipe's docstring)


def _steps_for(tokens: float, batch: int) -> int:
    return math.ceil(tokens / (batch * SEQ_4K))


def nemotron4_15b_phases_tp8_pp2_dp4() -> RunConfig:
    """Nemotron-4-15B pretraining in its reported phases on 64 GPUs (TP8 + SP x PP2 x DP4).

    Reported (Nemotron-4 15B technical report, Table 2): the global batch ramps 384 -> 768 ->
    1152 sequences of 4096 tokens, 0.2T tokens at each of the first two sizes, then 7.6T at
    1152 (8T in all); peak lr 4.5e-4. As `train.rampup_batch_size=[384, 384, 0.4T / 4096
    samples]` the two increments fall at 0.2T and 0.4T tokens, as reported. The report grows
    the data-parallel size with the batch (96, 192, 288 replicas); one launch here keeps DP4
    and raises the micro-batches per step instead (the same samples per step).

    After pretraining the report switches the data distribution and the learning-rate decay
    for a continued-training phase. Not published for 15B: the length of that phase, its
    blend weights and its decay shape. This recipe takes the length from the Nemotron-4 340B
    report, which follows the same procedure with 1T continued tokens after 8T; its blend files
    (conf/data/nemotron4_pretraining.yaml, conf/data/nemotron4_continued.yaml) are examples
    whose paths and weights you replace with your own; one cosine schedule runs over both
    phases (set scheduler.style=wsd and the phase's lr_decay to place a decay in it).
    """
    cfg = nemotron4_15b_tp8_pp2_dp4()
    cfg.train.global_batch_size = 1152
    ramp_samples = round(0.4e12 / SEQ_4K)
    cfg.train.rampup_batch_size = [384, 384, ramp_samples]
    schedule = ramp_schedule(cfg)
    ramp = ramp_steps(schedule)
    pretrain = ramp + _steps_for(PRETRAIN_TOKENS - samples_after(schedule, ramp) * SEQ_4K, 1152)
    cfg.train.train_iters = pretrain + _steps_for(CONTINUED_TOKENS, 1152)
    cfg.data.source = "blend"
    cfg.data.blend = "conf/data/nemotron4_pretraining.yaml"
    cfg.phases = [
        PhaseConfig(name="pretraining", end_step=pretrain),
        PhaseConfig(name="continued", end_step=cfg.train.train_iters,
                    blend="conf/data/nemotron4_continued.yaml"),
    ]
    return cfg


RECIPES = (nemotron4_15b_tp8_pp2_dp4, nemotron4_15b_phases_tp8_pp2_dp4)
