"""Step-time benchmark: this trainer's step vs a bare Megatron Core step on the same model.

Both steps run in the same processes on the same DDP model, optimizer and layout, alternating
(ours, bare, bare in memory, ours, ...) so machine drift hits all equally. The bare step is what
a hand-written Megatron Core loop does: zero grads, `forward_backward_func` whose forward step
reads its micro-batch from the run's dataset (as Megatron-LM's `get_batch` takes it from its
data iterator: for Megatron's GPTDataset, `dataset[i]` of each sample, stacked), `optimizer.step`,
scheduler step, and the loss all-reduce over DP x CP that Megatron-LM's own `train_step` runs
every step for its log. The bare step in memory trains one batch read before the benchmark: the
floor with no read at all. Ours is the loop's step: its batch read through the run's phases and
blend accounting, the step clock, the stop flags' sum started for the next step, and at the log
interval the sum of the steps' figures over the world (`trainer/step_figures.py`), timed with the
step it follows. Reported: median step times, and the ratio of each interleaved round (our step
over each bare step of its round): their median and spread (lowest and highest), at least five.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence

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
    batch = to_compute_device(next(data_iterator))
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, lambda out: _bare_loss(batch["loss_mask"], out)


class ReadOnDemand:
    """A step's micro-batches, each read from the dataset when the schedule first asks for it;
    the interleaved schedule's model chunks, each iterating on its own, share one read."""

    def __init__(self, source, microbatch_indices: list) -> None:
        self.source, self.indices, self.read = source, microbatch_indices, []

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator:
        for number, indices in enumerate(self.indices):
            if number == len(self.read):
                self.read.append(self.source.microbatch(indices))
            yield self.read[number]


def bare_step(session, microbatches: Sequence) -> float:
    """One step of a minimal Megatron Core loop over `microbatches` (host batches, moved to the
    compute device by the forward step, as Megatron-LM's `get_batch` does); its wall time."""
    cfg, model = session.cfg, session.model
    start = time.perf_counter()
    for chunk in model:
        chunk.zero_grad_buffer()
    session.optimizer.zero_grad()
    # The interleaved schedule pulls each model chunk's micro-batches from its own iterator.
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


MIN_PAIRS = 5  # interleaved rounds a ratio is reported over


def pair_ratios(ours: list[float], bare: list[float], prefix: str = "pair_ratio") -> dict:
    """Each round's ratio (ours over the bare step of the same round): median and spread."""
    ratios = [a / b for a, b in zip(ours, bare, strict=True)]
    return {f"{prefix}_median": statistics.median(ratios), f"{prefix}_min": min(ratios),
            f"{prefix}_max": max(ratios), "pairs": len(ratios)}


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
    """Alternate ours / bare / bare in memory for `warmup + steps` rounds; medians and round
    ratios over the last `steps` (each round's figures are the slowest rank's: a MAX over
    ranks). The bare step reads global batches 0, 1, 2, ... of the first phase's stream: other
    samples than ours, the same number and sizes."""
    stream = session.train_batches.stream_at(0)
    in_memory = stream.microbatches(0)
    rounds = warmup + steps
    indices = [stream.microbatch_indices(step) for step in range(rounds)]
    times: dict[str, list[float]] = {"ours": [], "bare": [], "in_memory": []}
    loop_step = LoopStep(session)
    for step in range(rounds):
        torch.distributed.barrier()
        times["ours"].append(loop_step())
        torch.distributed.barrier()
        times["bare"].append(bare_step(session, ReadOnDemand(stream.source, indices[step])))
        torch.distributed.barrier()
        times["in_memory"].append(bare_step(session, in_memory))
    loop_step.close()
    # Ranks finish at slightly different times; the slowest rank sets each step's time.
    measured = torch.tensor([times[key][warmup:] for key in ("ours", "bare", "in_memory")],
                            dtype=torch.float64, device=compute_device())
    torch.distributed.all_reduce(measured, op=torch.distributed.ReduceOp.MAX)
    ours_s, bare_s, in_memory_s = (row.tolist() for row in measured)
    medians = [statistics.median(row) for row in (ours_s, bare_s, in_memory_s)]
    return {
        "ours_s": medians[0],
        "bare_s": medians[1],
        "bare_in_memory_s": medians[2],
        "ratio": medians[0] / medians[1],
        "ratio_in_memory": medians[0] / medians[2],
        **pair_ratios(ours_s, bare_s),
        **pair_ratios(ours_s, in_memory_s, prefix="in_memory_ratio"),
        "steps": steps,
        "warmup": warmup,
    }
