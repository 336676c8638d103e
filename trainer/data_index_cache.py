"""A damaged dataset-index cache in `<run_dir>/data_index/` is refused in one line, not read.

Why: Megatron Core's `GPTDataset` and `BlendedDataset` write their document, sample and shuffle
indexes (and a blend's dataset indexes) there as `.npy` files on the first start and, on every
later start whose files are all present, load them with `numpy.load(..., allow_pickle=True)`
without a look at what they hold (`datasets/gpt_dataset.py`, `safe_numpy_load`). A file whose
header was written over then ends the ranks in an `UnpicklingError` traceback, one cut short in
`EOF: reading array header`, and one cut short after its header in numpy's `mmap length is
greater than file size`. Megatron writes these files only from arrays of integers, so a file is
whole by `data_prep.npy_file.npy_problem` (header readable, plain numbers, the size its
header says), the rule the pack index uses too. The fix is always the same: delete the folder,
and Megatron builds the same indexes again (they follow from the data, the seed and the sample
counts) at the next start.

Only headers and sizes are read (a few hundred bytes a file), so the check costs nothing beside
building the datasets; a file damaged inside its body with its size intact is not found here.
"""

from __future__ import annotations

from pathlib import Path

from data_prep.npy_file import npy_problem
from plugins.protocol.errors import ConfigError


def cache_entry_problem(path: Path) -> str | None:
    """What is wrong with one `*.npy` entry of the cache folder: not a regular file, or
    `npy_problem`'s answer."""
    if not path.is_file():
        return "is not a regular file"
    return npy_problem(path)


def damaged_cache_message(folder: Path) -> str | None:
    """The one-line refusal of the first damaged `.npy` file (by name) of the cache `folder`,
    naming it and the fix; None when the folder is absent or every file is whole."""
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.npy")):
        if problem := cache_entry_problem(path):
            return (f"Megatron's dataset index cache file {path} {problem}; delete the folder "
                    f"{folder} (Megatron builds the same indexes again at the next start)")
    return None


def check_data_index_cache(folder: Path) -> None:
    """Refuse (`ConfigError`) a cache folder holding a damaged `.npy` file, before Megatron
    reads it."""
    if message := damaged_cache_message(folder):
        raise ConfigError(message)
