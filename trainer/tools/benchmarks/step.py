"""Step-time benchmark: this trainer's step vs a bare Megatron Core step on the same model.

Both steps run in the same processes on the same DDP model, optimizer and layout, alternating
(ours, bare, ours, bare, ...) so machine drift hits both equally. The bare step is what a
hand-written Megatron Core loop does with micro-batches already in memory: zero grads,
`forward_backward_func`, `optimizer.step`, scheduler step, and the loss all-reduce over DP x CP
that Megatron-LM's own `train_step` runs every step for its log. Ours is the loop's step: data
slicing, the step clock, the stop flags' sum started for the next step, and at the log interval
the sum of the steps' figures over the world (`trainer/step_figures.py`), timed with the step
it follows. Reported: median step times, and the ratio of each interleaved pair (our step over
the bare step that follows it): their median and spread (lowest and highest), at least five
pairs.
"""

from __future__ import annotations

import statistics
import time

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from trainer.device import compute_device, to_compute_device
from trainer.loop import StopRequest
from trainer.step import run_step
from trainer.step_figures import settle_steps


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


MIN_PAIRS = 5  # interleaved pairs a ratio is reported over


def pair_ratios(ours: list[float], bare: list[float]) -> dict:
    """Each pair's ratio (ours over the bare step run right after it): median and spread."""
    ratios = [a / b for a, b in zip(ours, bare, strict=True)]
    return {"pair_ratio_median": statistics.median(ratios), "pair_ratio_min": min(ratios),
            "pair_ratio_max": max(ratios), "pairs": len(ratios)}


class LoopStep:
    """The loop's step (`trainer/loop.py`) without its log lines: the stop flags' sum started,
    `run_step`, that sum read, and the world sum of the steps' figures at the log interval.
    Its time: the step's clock (after the barrier that starts a step on CPU ranks) plus what
    comes before and after it."""

    def __init__(self, session):
        self.session, self.stop, self.pending = session, StopRequest(), []
        self.interval = max(1, session.cfg.logging.log_interval)

    def __call__(self) -> float:
        before = time.perf_counter()
        self.stop.begin_step()
        started = time.perf_counter() - before
        record = run_step(self.session)
        after = time.perf_counter()
        self.stop.end_step()
        self.pending.append(record)
        if record.step % self.interval == 0:
            settle_steps(self.session, self.pending)
            self.pending.clear()
        return started + sum(record.clock.seconds()) + time.perf_counter() - after

    def close(self) -> None:
        settle_steps(self.session, self.pending)


def compare_step_times(session, steps: int, warmup: int) -> dict:
    """Alternate ours/bare for `warmup + steps` rounds; medians and pair ratios over the last
    `steps` (each rank's slowest-rank figures: the MAX over ranks of every round)."""
    in_memory = [to_compute_device(mb) for mb in session.train_batches.microbatches(0)]
    ours, bare, loop_step = [], [], LoopStep(session)
    for _ in range(warmup + steps):
        torch.distributed.barrier()
        ours.append(loop_step())
        torch.distributed.barrier()
        bare.append(bare_step(session, in_memory))
    loop_step.close()
    # Ranks finish at slightly different times; the slowest rank sets each step's time.
    rounds = torch.tensor([ours[warmup:], bare[warmup:]], dtype=torch.float64,
                          device=compute_device())
    torch.distributed.all_reduce(rounds, op=torch.distributed.ReduceOp.MAX)
    ours_s, bare_s = rounds[0].tolist(), rounds[1].tolist()
    ours_median, bare_median = statistics.median(ours_s), statistics.median(bare_s)
    return {
        "ours_s": ours_median,
        "bare_s": bare_median,
        "ratio": ours_median / bare_median,
        **pair_ratios(ours_s, bare_s),
        "steps": steps,
        "warmup": warmup,
    }
