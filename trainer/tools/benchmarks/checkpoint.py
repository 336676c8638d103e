"""Checkpoint benchmark: save and load time next to `dd conv=fsync` of the same bytes, the
training-step stall with asynchronous saving on and off, and where a save's time goes.

Why: a save that costs several times the raw write (measured before the save path was tuned:
~3.3 s fixed even at 4 MB, and 7-10x dd at 1.4 GB) is paid at every save interval by every
rank, so the trainer must know what it pays and where. Goals: save <= 2 x dd + 0.5 s, load
<= 2 x dd, async stall <= 0.2 s.

Every figure comes from the same processes in the same run (2 shared CPU cores make absolute
times drift; ratios measured side by side do not): after one warm-up training step, each
repeat saves through `trainer.checkpoint.save.save_checkpoint` (the trainer's own path:
atomic publication included), writes the same number of bytes with `dd ... conv=fsync` on rank
0 in the same directory, and loads the checkpoint back through `load_checkpoint`. The first save
of a process is reported apart: Megatron starts process-wide helpers on it. Phases are timed by
wrapping Megatron's and our functions for the duration of the benchmark (nested phases overlap;
barriers include waiting for the slowest rank). The async part times normal steps, then three
steps that also start a save through the same `save_checkpoint` with checkpoint.async_save=true
(Megatron's asynchronous save, trainer/checkpoint/async_save.py), then the steps until it is
published. The stall with async off is the synchronous save itself; with async on it is
reported two ways: the step that starts the save minus a normal step, and the time blocked in
starting it (less noisy on a shared machine).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import statistics
import subprocess
import time
import warnings
from pathlib import Path

from recipes.config.schema import RunConfig

MIB = 1 << 20

# (module, attribute or Class.method, label): the phases of one save and one load.
PHASES = (
    ("trainer.checkpoint.publish", "_shared_token", "save: token broadcast"),
    ("trainer.checkpoint.state_dicts", "model_sharded_state_dict", "save+load: model sharded dict"),
    ("trainer.checkpoint.save", "_write_sharded", "save: sharded dicts + dist_checkpointing.save"),
    ("megatron.core.dist_checkpointing.serialization", "save_preprocess",
     "save: save_preprocess (factories, validation)"),
    ("megatron.core.dist_checkpointing.state_dict_utils", "determine_global_metadata",
     "save: validation metadata all_gather_object"),
    ("megatron.core.dist_checkpointing.state_dict_utils", "validate_sharding_integrity",
     "save: validate_sharding_integrity"),
    ("megatron.core.dist_checkpointing.strategies.state_dict_saver",
     "save_state_dict_async_plan", "save: torch DCP plan + prepare_write_data"),
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlanner.create_local_plan",
     "save: DCP local plan (until cached)"),
    ("megatron.core.dist_checkpointing.strategies.filesystem_async",
     "FileSystemWriterAsync.prepare_write_data",
     "save: prepare_write_data (copies of CPU views)"),
    ("megatron.core.dist_checkpointing.strategies.filesystem_async", "get_write_results_queue",
     "save: results queue (spawned multiprocessing Manager)"),
    ("megatron.core.dist_checkpointing.strategies.filesystem_async",
     "FileSystemWriterAsync.write_preloaded_data", "save: write shards + fsync"),
    ("megatron.core.dist_checkpointing.strategies.state_dict_saver",
     "save_state_dict_async_finalize", "save: finalize (gather results, write .metadata)"),
    ("megatron.core.dist_checkpointing.serialization", "save_config", "save: metadata.json"),
    ("megatron.core.dist_checkpointing.strategies.fully_parallel",
     "FullyParallelSaveStrategyWrapper.apply_saving_parallelization",
     "save: fully parallel distribution (+ validation)"),
    ("trainer.checkpoint.disk_errors", "agree", "save: each phase's outcome shared (all ranks)"),
    ("megatron.core.dist_checkpointing.strategies.async_utils",
     "AsyncCallsQueue.schedule_async_request", "async: start the writer (preload, fork)"),
    ("trainer.checkpoint.megatron_fixes", "forked_results_queue", "async: fork the results queue"),
    ("trainer.checkpoint.async_save", "finish_saves", "async: finish_saves (check, publish)"),
    ("trainer.checkpoint.publish", "_write_manifest", "save: run.json (checksums of every file)"),
    ("trainer.checkpoint.publish", "_rename_into_place", "save: publish (rename)"),
    ("trainer.checkpoint.publish", "_point_latest", "save: latest marker (write, rename, fsync)"),
    ("trainer.checkpoint.publish", "_rotate", "save: rotate"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer.sharded_state_dict",
     "save+load: optimizer sharded dict"),
    ("megatron.core.optimizer.distrib_optimizer",
     "DistributedOptimizer.sharded_param_state_fully_reshardable",
     "save+load: optimizer fully_reshardable state (gather over DP)"),
    ("megatron.core.optimizer.distrib_optimizer",
     "DistributedOptimizer.sharded_param_state_dp_reshardable",
     "save+load: optimizer dp_reshardable state"),
    ("trainer.checkpoint.state_dicts", "rng_template",
     "load: common state (the RNG streams' grid)"),
    ("megatron.core.dist_checkpointing", "load_content_metadata", "load: content metadata"),
    ("megatron.core.dist_checkpointing", "load", "load: dist_checkpointing.load"),
    ("megatron.core.dist_checkpointing.serialization", "determine_global_metadata",
     "load: metadata all_gather_object"),
    ("megatron.core.dist_checkpointing.serialization", "validate_integrity_and_strict_load",
     "load: integrity / strict check"),
    ("megatron.core.dist_checkpointing.strategies.torch", "TorchDistLoadShardedStrategy.load",
     "load: torch DCP read"),
    ("trainer.checkpoint.megatron_fixes", "create_state_if_missing", "load: dummy optimizer state"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer.load_state_dict",
     "load: optimizer.load_state_dict"),
    ("torch.distributed", "barrier", "barriers (incl. waiting)"),
    ("torch.distributed", "all_gather_object", "all_gather_object"),
    ("torch.distributed", "broadcast_object_list", "broadcast_object_list"),
)


class PhaseTimer:
    """Wraps functions in place while active and adds up their wall time and calls per label."""

    def __init__(self, phases=PHASES):
        self.phases = phases
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._restore: list = []

    def _wrap(self, function, label):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start
                self.calls[label] = self.calls.get(label, 0) + 1

        return timed

    def _patch(self, owner, name: str, label: str) -> None:
        static = inspect.getattr_static(owner, name)
        function = static.__func__ if isinstance(static, staticmethod) else getattr(owner, name)
        wrapped = self._wrap(function, label)
        setattr(owner, name, staticmethod(wrapped) if isinstance(static, staticmethod) else wrapped)
        self._restore.append((owner, name, static))

    def __enter__(self):
        import importlib

        for module_name, attribute, label in self.phases:
            owner = importlib.import_module(module_name)
            *classes, name = attribute.split(".")
            for class_name in classes:
                owner = getattr(owner, class_name)
            self._patch(owner, name, label)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def take(self) -> dict[str, dict]:
        """The figures since the last take, then reset."""
        taken = {label: {"s": round(self.seconds[label], 4), "calls": self.calls[label]}
                 for label in self.seconds}
        self.seconds, self.calls = {}, {}
        return taken


def _barrier() -> None:
    import torch

    torch.distributed.barrier()


def _rank0() -> bool:
    import torch

    return torch.distributed.get_rank() == 0


def _progress(line: str) -> None:
    if _rank0():
        print(f"[bench_checkpoint] {line}", flush=True)


def _slowest(seconds: float) -> float:
    """The slowest rank's figure (every rank calls this)."""
    import torch

    value = torch.tensor([seconds], dtype=torch.float64)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return value.item()


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def dd_seconds(directory: Path, nbytes: int) -> float:
    """`dd if=/dev/zero conv=fsync` of `nbytes` (rounded up to MiB) in `directory`; the file is
    removed afterwards."""
    target = Path(directory) / "dd.bench"
    count = max(1, -(-nbytes // MIB))
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}",
                    "conv=fsync", "status=none"], check=True)
    seconds = time.perf_counter() - start
    target.unlink()
    return seconds


def _dd_on_rank0(directory: Path, nbytes: int) -> float:
    """Rank 0 runs dd while the others wait; every rank gets the figure."""
    seconds = dd_seconds(directory, nbytes) if _rank0() else 0.0
    return _slowest(seconds)


def _timed_save(session, root: Path, timer: PhaseTimer) -> tuple[Path, float]:
    from trainer.checkpoint.save import save_checkpoint

    _barrier()
    timer.take()  # only the save itself from here
    start = time.perf_counter()
    path = save_checkpoint(session, root)
    return path, _slowest(time.perf_counter() - start)


def _timed_load(session, path: Path, timer: PhaseTimer) -> float:
    from trainer.checkpoint.load import load_checkpoint

    _barrier()
    timer.take()
    start = time.perf_counter()
    load_checkpoint(session, path)
    return _slowest(time.perf_counter() - start)


def measure_sync(session, root: Path, repeats: int, timer: PhaseTimer) -> list[dict]:
    """Per repeat: bytes, save/load seconds, dd of the same bytes, and each phase's time."""
    results = []
    for repeat in range(repeats):
        _progress(f"save {repeat + 1}/{repeats} ...")
        path, save_s = _timed_save(session, root, timer)
        save_phases = timer.take()
        nbytes = directory_bytes(path) if _rank0() else 0
        nbytes = int(_slowest(float(nbytes)))
        dd_s = _dd_on_rank0(root, nbytes)
        _progress(f"load {repeat + 1}/{repeats} ...")
        load_s = _timed_load(session, path, timer)
        results.append({"repeat": repeat + 1, "bytes": nbytes, "save_s": round(save_s, 4),
                        "load_s": round(load_s, 4), "dd_s": round(dd_s, 4),
                        "save_phases": save_phases, "load_phases": timer.take()})
        _barrier()
        if _rank0():
            shutil.rmtree(path, ignore_errors=True)
        _barrier()
    return results


def _timed_step(session) -> float:
    from trainer.step import train_step

    start = time.perf_counter()
    train_step(session)
    return time.perf_counter() - start


def _steps_until_published(session, limit: int) -> tuple[list[float], int]:
    """Train while the async save writes; each step ends as the run loop's does, with the
    (collective) `finish_saves`. Returns the step times and how many ran before publication."""
    from trainer.checkpoint.async_save import finish_saves

    times = []
    while session.async_saves.in_flight and len(times) < limit:
        start = time.perf_counter()
        _timed_step(session)
        finish_saves(session, blocking=False)
        times.append(time.perf_counter() - start)
    overlapped = len(times)
    finish_saves(session, blocking=True)
    return times, overlapped


def _one_async_save(session, root: Path, median: float, timer: PhaseTimer) -> dict:
    """The step that starts an async save (`save_checkpoint` with checkpoint.async_save=true,
    the trainer's own path) vs a normal step; then steps until it is published."""
    from trainer.checkpoint.save import save_checkpoint

    _barrier()
    timer.take()
    start = time.perf_counter()
    _timed_step(session)
    started = time.perf_counter()
    path = save_checkpoint(session, root)
    start_s = _slowest(time.perf_counter() - started)
    saving_step = _slowest(time.perf_counter() - start)
    scheduling = timer.take()
    after, overlapped = _steps_until_published(session, limit=20)
    total_s = _slowest(time.perf_counter() - start)
    complete = (root / "latest").exists() and (root / "latest").read_text() == path.name
    nbytes = directory_bytes(path) if path.exists() else 0
    _barrier()
    if _rank0():
        shutil.rmtree(path, ignore_errors=True)
    return {"saving_step_s": round(saving_step, 4), "stall_s": round(saving_step - median, 4),
            "start_s": round(start_s, 4),
            "steps_after": [round(_slowest(t), 4) for t in after],
            "steps_overlapped": overlapped, "until_published_s": round(total_s, 4),
            "complete": complete, "phases": scheduling, "bytes": nbytes}


ASYNC_SAVES = 3


def measure_async(session, root: Path, steps: int, timer: PhaseTimer) -> dict:
    """Normal steps, then three async saves through the trainer: the first starts the writer's
    results queue, validates the sharding and plans; the second plans again, gathering every
    rank's plan, and finds it equal to the first (Megatron sets `validated_cache_reuse` from
    that comparison, strategies/state_dict_saver.py:166); the third is the first to reuse the
    cached plan (:128-131), what every later save of the run pays."""
    _progress(f"async save: {steps} normal steps, then steps that start saves ...")
    normal = [_slowest(_timed_step(session)) for _ in range(steps)]
    median = statistics.median(normal)
    figures = {"normal_step_s": round(median, 4), "saves": []}
    session.cfg.checkpoint.async_save = True
    try:
        for number in range(1, ASYNC_SAVES + 1):
            _progress(f"async save {number}/{ASYNC_SAVES} ...")
            figures["saves"].append({"number": number,
                                     **_one_async_save(session, root, median, timer)})
    finally:
        session.cfg.checkpoint.async_save = False
    return figures


def _verdicts(row: dict) -> dict:
    """The goals next to one repeat's figures."""
    save_goal = 2 * row["dd_s"] + 0.5
    load_goal = 2 * row["dd_s"]
    return {"save_goal_s": round(save_goal, 4), "save_ok": row["save_s"] <= save_goal,
            "save_vs_dd": round(row["save_s"] / row["dd_s"], 2),
            "load_goal_s": round(load_goal, 4), "load_ok": row["load_s"] <= load_goal,
            "load_vs_dd": round(row["load_s"] / row["dd_s"], 2)}


def _phase_lines(title: str, phases: dict) -> list[str]:
    lines = [f"  {title}:"]
    for label, figure in sorted(phases.items(), key=lambda item: -item[1]["s"]):
        lines.append(f"    {figure['s']:8.3f} s  x{figure['calls']:<4d} {label}")
    return lines


def report_lines(name: str, figures: dict) -> list[str]:
    """The human-readable table; the same figures go out as one JSON line."""
    ok = {True: "ok", False: "MISSED"}
    lines = [f"bench_checkpoint {name}: {figures['parameters']:,} parameters, "
             f"{figures['ranks']} ranks, optimizer format {figures['optimizer_format']}; "
             f"load average {figures['load_average']:.1f} on {figures['cores']} cores",
             "  save    bytes        save s   dd s    goal s  (x dd)   load s  goal s  (x dd)"]
    for row in figures["sync"]:
        v = row["verdict"]
        which = "first" if row["repeat"] == 1 else f"#{row['repeat']}"
        lines.append(f"  {which:6s} {row['bytes'] / 1e6:9.1f} MB {row['save_s']:7.3f} "
                     f"{row['dd_s']:6.3f} {v['save_goal_s']:7.3f} {ok[v['save_ok']]:6s} "
                     f"({v['save_vs_dd']:.1f}x) {row['load_s']:7.3f} {v['load_goal_s']:6.3f} "
                     f"{ok[v['load_ok']]:6s} ({v['load_vs_dd']:.1f}x)")
    for row in figures["sync"][:2]:
        lines += _phase_lines(f"phases of save #{row['repeat']}", row["save_phases"])
    lines += _phase_lines("phases of the last load", figures["sync"][-1]["load_phases"])
    a = figures["async"]
    sync_stall = figures["sync"][-1]["save_s"]
    lines.append(f"  step stall (goal 0.2 s; normal step {a['normal_step_s']:.3f} s): async off "
                 f"{sync_stall:.3f} s (the synchronous save), async on: the step that starts "
                 "the save - a normal step, and the time blocked starting it:")
    for row in a["saves"]:
        stall = max(row["stall_s"], row["start_s"])
        lines.append(f"    async save {row['number']}: step+start {row['saving_step_s']:.3f} s, "
                     f"stall {row['stall_s']:.3f} s, blocked {row['start_s']:.3f} s "
                     f"{ok[stall <= 0.2]} ({sync_stall / max(stall, 1e-3):.3g}x less than off); "
                     f"published after {row['steps_overlapped']} more steps "
                     f"({', '.join(f'{t:.2f}' for t in row['steps_after'])} s), "
                     f"{row['until_published_s']:.2f} s, complete={row['complete']}")
    for row in a["saves"]:
        lines += _phase_lines(f"phases of starting async save {row['number']}", row["phases"])
    return lines


def bench_checkpoint_rank(cfg: RunConfig, run_dir: Path, options) -> int:
    """One warm-up step, the sync saves/loads, the async save; rank 0 prints and records."""
    import torch

    from trainer.session import start_session
    from trainer.summary import model_parameter_count

    warnings.filterwarnings("ignore", module=r"torch\.distributed\.checkpoint.*")
    session = start_session(cfg, run_dir)
    root = run_dir / "bench_checkpoints"
    _progress("warm-up training step ...")
    _timed_step(session)  # a full checkpoint needs optimizer state (docs/checkpoints.md)
    with PhaseTimer() as timer:
        sync = measure_sync(session, root, options["repeats"], timer)
        async_figures = measure_async(session, root, options["steps"], timer)
    for row in sync:
        row["verdict"] = _verdicts(row)
    figures = {"recipe": cfg.name, "parameters": model_parameter_count(session.model),
               "load_average": os.getloadavg()[0], "cores": os.cpu_count(),
               "ranks": torch.distributed.get_world_size(),
               "optimizer_format": cfg.checkpoint.optimizer_format,
               "distributed_optimizer": cfg.optimizer.distributed,
               "sync": sync, "async": async_figures}
    if _rank0():
        print("\n".join(report_lines(cfg.name, figures)), flush=True)
        print(json.dumps(figures), flush=True)
        (run_dir / "bench_checkpoint.json").write_text(json.dumps(figures) + "\n")
    return 0
