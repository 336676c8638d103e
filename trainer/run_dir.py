"""What a run writes in its directory, checked before it starts there.

A run directory is reused by every resume, requeue and phase of its run: something of the wrong
kind where the run writes (a folder named `config.yaml`, a file named `checkpoints`) would end a
rank in a traceback, the checkpoint's only after every step has trained. And the log a resume
continues (`metrics.jsonl`, cut to the resumed step by `RunReporter.continue_from`) must be
records: a last line cut short by a killed rank is what such a log ends with and is dropped, a
damaged line before it is refused here, naming the file and line.
"""

from __future__ import annotations

from pathlib import Path

from plugins.protocol.errors import ConfigError
from plugins.protocol.metrics_file import METRICS_FILE, record_lines
from recipes.config.io import CONFIG_FILENAME
from trainer.checkpoint.format import RUN_CHECKPOINTS

RUN_LOCK = ".run.lock"  # in the run directory (and a checkpoint root elsewhere): who runs in it
DATA_INDEX = "data_index"  # Megatron's cached dataset indices
# Each entry the run writes, whether it is a folder, and what it holds.
RUN_ENTRIES = {
    CONFIG_FILENAME: (False, "resolved config"),
    METRICS_FILE: (False, "log of steps"),
    RUN_LOCK: (False, "lock"),
    RUN_CHECKPOINTS: (True, "checkpoints"),
    DATA_INDEX: (True, "cached dataset indices"),
}


def entry_in_the_way(run_dir: Path) -> str | None:
    """The first entry of `run_dir` that is of the other kind than the run writes there (a
    folder for a file, a file for a folder), as a one-line refusal; None when none is."""
    for name, (folder, what) in RUN_ENTRIES.items():
        path = run_dir / name
        if not path.exists():
            continue
        if path.is_dir() != folder:
            kind, wanted = ("a file", "folder") if folder else ("a folder", "file")
            return (f"{path} is {kind}, where the run keeps its {what} (a {wanted}); move it "
                    f"out of the run directory, or give the run another run_dir=")
    return None


def metrics_problem(run_dir: Path) -> str | None:
    """Why the run's `metrics.jsonl` cannot be continued, or None (none yet, or only a cut-short
    last line, which the continued log drops)."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return None
    fix = (f"move {path} aside (the run starts a new log) or delete that line, and run "
           "again")
    try:
        record_lines(path, path.read_bytes(), fix)
    except ConfigError as error:
        return str(error)
    except OSError as error:
        return f"{path} cannot be read ({error.strerror}); {fix}"
    return None


def check_run_dir(run_dir: Path) -> None:
    """Refuse, in one line, a run directory the run cannot write or continue in."""
    problem = entry_in_the_way(run_dir) or metrics_problem(run_dir)
    if problem:
        raise ConfigError(problem)
