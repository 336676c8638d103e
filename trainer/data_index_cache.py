"""A damaged dataset-index cache in `<run_dir>/data_index/` is refused in one line, not read.

Why: Megatron Core's `GPTDataset` and `BlendedDataset` write their document, sample and shuffle
indexes (and a blend's dataset indexes) there as `.npy` files on the first start and, on every
later start whose files are all present, load them with `numpy.load(..., allow_pickle=True)`
without a look at what they hold (`datasets/gpt_dataset.py`, `safe_numpy_load`). A file whose
header was written over then ends the ranks in an `UnpicklingError` traceback, one cut short in
`EOF: reading array header`, and one cut short after its header in numpy's `mmap length is
greater than file size`. Megatron writes these files only from arrays of integers, so a file is
whole when numpy's own header reader (`numpy.lib.format`) reads its header, the header
describes an array of plain numbers, and the file is exactly the header plus shape x item size
bytes long. The fix is always the same: delete the folder, and Megatron builds the same indexes
again (they follow from the data, the seed and the sample counts) at the next start.

Only headers and sizes are read (a few hundred bytes a file), so the check costs nothing beside
building the datasets; a file damaged inside its body with its size intact is not found here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from plugins.protocol.errors import ConfigError


def npy_problem(path: Path) -> str | None:
    """What is wrong with the `.npy` file at `path` as a cached index (unreadable header, an
    array of Python objects, a size other than its header says), or None when it is whole."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            version = npy_format.read_magic(file)
            read_header = (npy_format.read_array_header_1_0 if version == (1, 0)
                           else npy_format.read_array_header_2_0)
            shape, _, dtype = read_header(file)
            offset = file.tell()
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"is damaged: its numpy header cannot be read ({reason})"
    if dtype.hasobject:
        return f"is damaged: it holds Python objects ({dtype}), not the integers Megatron writes"
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size != expected:
        return (f"is damaged: it is {size:,} bytes, but its header ({dtype} {tuple(shape)}) "
                f"says {expected:,} (cut short or written over)")
    return None


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
