"""Settings every 64-GPU recipe shares (8 nodes x 8 GPUs, bf16, overlapped distributed optimizer).

Each family file derives its recipes from `large_run_base` and sets only layout and batch; the
Nemotron recipes, whose every setting carries its source (`recipes/sources.py`), take the run's
infrastructure as the `RUN_64GPU` table.
A run across nodes loses a node now and then: it checkpoints every `SAVE_INTERVAL` steps and
keeps the newest `KEEP_LAST`, so a requeued job (`checkpoint.resume=true`) loses at most that
many steps and a damaged newest checkpoint still has one before it to fall back to. Its data
must be a prepared blend: the built-in corpus is refused before launch beyond one node
(`recipes/config/path_rules.py`), so these recipes name none and the user passes
`data.source=blend data.blend=conf/data/<blend>.yaml`.
"""

from __future__ import annotations

from recipes.config.schema import (
    ModelConfig,
    OptimizerConfig,
    PrecisionConfig,
    RunConfig,
    SchedulerConfig,
    TrainConfig,
)
from recipes.sources import Settings, build, ours

# Megatron Bridge's pretraining recipes save every 500-2000 steps; 500 loses at most about an
# hour of a 64-GPU step budget of ~5-10 s per step.
SAVE_INTERVAL = 500
KEEP_LAST = 2

# How this project runs a 64-GPU job, whatever the model: each value this project's own choice.
RUN_64GPU: Settings = {
    "cluster.nodes": ours(8, "the 64-GPU layout: 8 nodes"),
    "cluster.gpus_per_node": ours(8, "8 GPUs a node"),
    "cluster.gpu_memory_gib": ours(80.0, "the planner's fit on 80 GB GPUs (H100)"),
    "train.eval_interval": ours(1000, "a held-out loss every 1,000 steps"),
    "train.eval_iters": ours(10, "10 held-out batches each time"),
    "train.manual_gc_interval": ours(100, "Python's collector every 100 steps, not at a random "
                                          "step that stalls every rank (as Megatron Bridge's "
                                          "recipes do)"),
    "optimizer.distributed": ours(True, "the distributed optimizer (ZeRO-1), as Megatron "
                                        "Bridge's recipes train"),
    "optimizer.overlap_grad_reduce": ours(True, "overlap the DP reduce with backward (speed "
                                                "only)"),
    "optimizer.overlap_param_gather": ours(True, "overlap the DP all-gather with forward "
                                                 "(speed only)"),
    "checkpoint.save_interval": ours(SAVE_INTERVAL, "a requeued job loses at most 500 steps"),
    "checkpoint.keep_last": ours(KEEP_LAST, "the newest 2 checkpoints: a damaged newest one "
                                            "still has one before it"),
}


def large_run_base(model: ModelConfig, lr: float) -> RunConfig:
    """Settings shared by the 64-GPU recipes; each recipe sets the layout and batch. The peak
    learning rate is the recipe's (each says where it is from); the floor (a tenth of it),
    warm-up, cosine decay, weight decay, Adam's betas and epsilon, clipping and the run length
    are this project's for these layouts, not a published run's."""
    cfg = build(RUN_64GPU)
    cfg.model = model
    cfg.train = TrainConfig(
        micro_batch_size=1, global_batch_size=128, train_iters=50_000,
        eval_interval=cfg.train.eval_interval, eval_iters=cfg.train.eval_iters,
        manual_gc_interval=cfg.train.manual_gc_interval)
    o = cfg.optimizer
    cfg.optimizer = OptimizerConfig(
        lr=lr, min_lr=lr / 10, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
        clip_grad=1.0, distributed=o.distributed, overlap_grad_reduce=o.overlap_grad_reduce,
        overlap_param_gather=o.overlap_param_gather)
    cfg.scheduler = SchedulerConfig(style="cosine", warmup_iters=2000)
    cfg.precision = PrecisionConfig(dtype="bf16")
    return cfg
