"""Settings every 64-GPU recipe shares (8 nodes x 8 GPUs, bf16, overlapped distributed optimizer).

Each family file derives its recipes from `large_run_base` and sets only layout and batch.
A run across nodes loses a node now and then: it checkpoints every `SAVE_INTERVAL` steps and
keeps the newest `KEEP_LAST`, so a requeued job (`checkpoint.resume=true`) loses at most that
many steps and a damaged newest checkpoint still has one before it to fall back to. Its data
must be a prepared blend: the built-in corpus is refused before launch beyond one node
(`recipes/config/path_rules.py`), so these recipes name none and the user passes
`data.source=blend data.blend=conf/data/<blend>.yaml`.
"""

from __future__ import annotations

from recipes.config.schema import (
    CheckpointConfig,
    ClusterConfig,
    ModelConfig,
    OptimizerConfig,
    PrecisionConfig,
    RunConfig,
    SchedulerConfig,
    TrainConfig,
)

# Megatron Bridge's pretraining recipes save every 500-2000 steps; 500 loses at most about an
# hour of a 64-GPU step budget of ~5-10 s per step.
SAVE_INTERVAL = 500
KEEP_LAST = 2


def large_run_base(model: ModelConfig, lr: float) -> RunConfig:
    """Settings shared by the 64-GPU recipes; each recipe sets the layout and batch."""
    return RunConfig(
        model=model,
        cluster=ClusterConfig(nodes=8, gpus_per_node=8, gpu_memory_gib=80.0),
        train=TrainConfig(
            micro_batch_size=1,
            global_batch_size=128,
            train_iters=50_000,
            eval_interval=1000,
            eval_iters=10,
            manual_gc_interval=100,
        ),
        optimizer=OptimizerConfig(
            lr=lr,
            min_lr=lr / 10,
            weight_decay=0.1,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_eps=1e-8,
            clip_grad=1.0,
            distributed=True,
            overlap_grad_reduce=True,
            overlap_param_gather=True,
        ),
        scheduler=SchedulerConfig(style="cosine", warmup_iters=2000),
        precision=PrecisionConfig(dtype="bf16"),
        checkpoint=CheckpointConfig(save_interval=SAVE_INTERVAL, keep_last=KEEP_LAST),
    )
