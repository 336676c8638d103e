"""Step-time benchmark: this trainer's step vs a bare Megatron Core step on the same model.

Both steps run in the same processes on the same DDP model, optimizer and layout, alternating
(ours, bare, ours, bare, ...) so machine drift hits both equally. The bare step is what a
hand-written Megatron Core loop does with micro-batches already in memory: zero grads,
`forward_backward_func`, `optimizer.step`, scheduler step, and the loss all-reduce over DP x CP
that Megatron-LM's own `train_step` runs every step for its log. Ours adds data slicing, the
loss reduction over the whole world (with the phase times riding on it), metrics and hooks.
Reported: median step times and their ratio.
"""

from __future__ import annotations

import statistics
import time

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from trainer.device import compute_device, to_compute_device
from trainer.step import train_step


def _bare_loss(loss_mask, output):
    mask = loss_mask.reshape(-1)
    total = torch.sum(output.float().reshape(-1) * mask)
    count = mask.sum().to(torch.int)
    return total, count, {"lm loss": torch.stack([total.detach(), count.float()])}


def _reduce_loss_like_megatron_lm(reports: list[dict]) -> None:
    """What Megatron-LM's `train_step` does after every update: the last stage sums the
    micro-batches' [loss, tokens] and all-reduces them over DP x CP for the log
    (megatron/training/training.py:2537-2548 in megatron-core 0.19.2)."""
    if not reports or not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return
    summed = torch.vstack([report["lm loss"].view(-1) for report in reports]).sum(dim=0)
    torch.distributed.all_reduce(
        summed, group=parallel_state.get_data_parallel_group(with_context_parallel=True))


def _bare_forward_step(data_iterator, model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, lambda out: _bare_loss(batch["loss_mask"], out)


def bare_step(session, microbatches: list) -> float:
    """One step of a minimal Megatron Core loop; returns its wall time."""
    cfg, model = session.cfg, session.model
    start = time.perf_counter()
    for chunk in model:
        chunk.zero_grad_buffer()
    session.optimizer.zero_grad()
    iterators = iter(microbatches) if len(model) == 1 else [iter(microbatches) for _ in model]
    reports = get_forward_backward_func()(
        forward_step_func=_bare_forward_step,
        data_iterator=iterators,
        model=model if len(model) > 1 else model[0],
        num_microbatches=len(microbatches),
        seq_length=cfg.model.seq_length,
        micro_batch_size=cfg.train.micro_batch_size,
        forward_only=False,
    )
    session.optimizer.step()
    session.scheduler.step(increment=cfg.train.global_batch_size)
    _reduce_loss_like_megatron_lm(reports)
    return time.perf_counter() - start


def compare_step_times(session, steps: int, warmup: int) -> dict:
    """Alternate ours/bare for `warmup + steps` rounds; medians over the last `steps`."""
    in_memory = [to_compute_device(mb) for mb in session.train_batches.microbatches(0)]
    ours, bare = [], []
    for _ in range(warmup + steps):
        torch.distributed.barrier()
        ours.append(train_step(session).step_time_s)
        torch.distributed.barrier()
        bare.append(bare_step(session, in_memory))
    ours_median = statistics.median(ours[warmup:])
    bare_median = statistics.median(bare[warmup:])
    # Ranks finish at slightly different times; the slowest rank sets the step time.
    figures = torch.tensor([ours_median, bare_median], dtype=torch.float64, device=compute_device())
    torch.distributed.all_reduce(figures, op=torch.distributed.ReduceOp.MAX)
    return {
        "ours_s": figures[0].item(),
        "bare_s": figures[1].item(),
        "ratio": figures[0].item() / figures[1].item(),
        "steps": steps,
        "warmup": warmup,
    }
