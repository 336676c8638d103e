"""What runs a preparation's shard tasks: a local process pool, or Ray.

Both run the same `data_prep.shards.run_task` on the same task values, so the output does not
depend on the executor or on the number of workers (each shard is written by one task, alone).
`executor=local` forks `num_proc` workers from the driver (which has already imported Megatron
Core and the tokenizer library, so a worker starts in milliseconds); one worker runs the tasks
in the driver itself. `executor=ray` submits one Ray task per shard to the cluster at
`ray_address=` or `RAY_ADDRESS`, or to a local Ray started for the run with `num_proc` CPUs (and
stopped after it); a Ray session already open in the process is used as it is. Ray retries a
task whose worker died; the records make any retry, or a re-run, idempotent. `ray` is imported
only here, only for that executor (the `ray` extra of pyproject.toml).

Local workers report how far into their shard they are through a queue the driver drains in a
thread (`progress`: the per-shard bars and the job's ETA); Ray tasks report only when done. A
task that fails with a user's problem (an unreadable line, a full disk) stops the job with its
one line: the pool's queued tasks are cancelled, the complete shards stay.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from data_prep.config import ray_address_problem, ray_head
from data_prep.shards import Report, TaskSpec, run_task
from plugins.protocol.errors import ConfigError

Done = Callable[[dict[str, Any]], None]
_REPORTS: Any = None  # in a pool worker: the queue its progress goes to
RAY_RETRIES = 3
ORPHAN_POLL_S = 0.2


class WorkerLost(RuntimeError):
    """A worker died mid-shard (killed, out of memory): the complete shards are kept."""


def _start_worker(driver: int, reports: Any) -> None:
    """In a worker: keep the progress queue; exit as soon as the driver is gone (a killed
    driver would otherwise leave its workers waiting on the task queue for ever); its
    half-written work file stays hidden."""
    global _REPORTS
    _REPORTS = reports

    def watch() -> None:
        while os.getppid() == driver:
            time.sleep(ORPHAN_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _report(prefix: str, share: float) -> None:
    _REPORTS.put((prefix, share))


def _pooled(spec: TaskSpec) -> dict[str, Any]:
    return run_task(spec, _report)


def _drain(reports: Any, progress: Report, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            progress(*reports.get(timeout=0.1))
        except queue.Empty:
            continue
        except (EOFError, OSError):
            return


def run_local(specs: Sequence[TaskSpec], workers: int, done: Done,
              progress: Report | None = None) -> None:
    if workers <= 1 or len(specs) <= 1:
        for spec in specs:
            done(run_task(spec, progress))
        return
    context = multiprocessing.get_context("fork")
    reports = context.SimpleQueue() if progress is None else context.Queue()
    stop = threading.Event()
    if progress is not None:
        threading.Thread(target=_drain, args=(reports, progress, stop), daemon=True).start()
    pool = ProcessPoolExecutor(max_workers=min(workers, len(specs)), mp_context=context,
                               initializer=_start_worker, initargs=(os.getpid(), reports))
    try:
        pending = {pool.submit(_pooled if progress else run_task, spec) for spec in specs}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                try:
                    done(future.result())
                except BrokenProcessPool:
                    raise WorkerLost(
                        "a preparation worker died mid-shard (killed or out of memory); run "
                        "the same command again: it keeps the complete shards and redoes the "
                        "rest") from None
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
        stop.set()


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("executor=ray needs Ray: pip install 'mcore-recipes[ray]' (or "
                          "pip install ray), or use executor=local") from None
    return ray


# Seconds a head's GCS port is given to answer before the run is refused: Ray itself retries
# an unreachable GCS for minutes, printing warnings, before it gives up.
GCS_CONNECT_S = 5.0


def gcs_unreachable(key: str, address: str | None,
                    timeout: float = GCS_CONNECT_S) -> str | None:
    """Why a `HOST:PORT` (a head's GCS) takes no connection within `timeout`, or None (for
    Ray Client's `ray://`, `auto` and `local`, Ray's own error is prompt)."""
    head = ray_head(address) if address else None
    if head is None or head[0] != "gcs":
        return None
    try:
        socket.create_connection(head[1:], timeout=timeout).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        return (f"{key}={address}: no Ray head answers there ({reason} within "
                f"{timeout:g} s); check the address and that `ray start --head` runs there, or "
                "leave ray_address and RAY_ADDRESS unset for a local Ray")
    return None


def run_ray(specs: Sequence[TaskSpec], workers: int, address: str | None, done: Done) -> None:
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        given, address = address, address or os.environ.get("RAY_ADDRESS") or None
        key = "ray_address" if address == given else "RAY_ADDRESS"
        if problem := (ray_address_problem(key, address) or gcs_unreachable(key, address)):
            raise ConfigError(problem)
        root = str(Path(__file__).resolve().parents[1])
        env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"))
                                            if p), "TOKENIZERS_PARALLELISM": "false"}
        try:
            ray.init(address=address, num_cpus=None if address else workers,
                     include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": env})
        except ConnectionError as err:
            raise ConfigError(f"ray_address={address}: cannot connect to a Ray cluster "
                              f"({str(err).splitlines()[0]}); check the address, or leave "
                              "ray_address and RAY_ADDRESS unset for a local Ray") from None
    try:
        task = ray.remote(num_cpus=1, max_retries=RAY_RETRIES)(run_task)
        pending = {task.remote(spec): spec for spec in specs}
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                pending.pop(ref)
                try:
                    record = ray.get(ref)
                except ray.exceptions.RayTaskError as err:
                    for other in pending:
                        ray.cancel(other)
                    if isinstance(err.cause, ConfigError):  # the task's one line
                        raise err.cause from None
                    raise
                done(record)
    finally:
        if started:
            ray.shutdown()


def run_tasks(specs: Sequence[TaskSpec], executor: str, workers: int, address: str | None,
              done: Done, progress: Report | None = None) -> None:
    if executor == "ray":
        run_ray(specs, workers, address, done)
    else:
        run_local(specs, workers, done, progress)
