"""Whether a `.npy` file is whole, read from its header and its size alone.

Why: the pack index (data_prep/packing.py) and Megatron's dataset index cache in a run
(trainer/data_index_cache.py) are both `.npy` files of plain integers that a crash, a full disk
or a hand edit can cut short or write over. `numpy.load` then fails in an UnpicklingError, an
`EOF` or an mmap error, or (bytes appended) maps without complaint. A file is whole when numpy's
own header reader (`numpy.lib.format`) reads its header, the header describes plain numbers, and
the file is exactly the header plus shape x item size bytes. This reads a few hundred bytes, so
both callers check every file they open; a body damaged at the right size is not seen here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format


def npy_problem(path: Path) -> str | None:
    """What is wrong with the `.npy` file at `path` (unreadable, a header numpy cannot read, an
    array of Python objects, a size other than its header says), as the end of a sentence that
    begins with the file's name; None when it is whole."""
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
        return f"is damaged: it holds Python objects ({dtype}), not plain numbers"
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size != expected:
        return (f"is damaged: it is {size:,} bytes, but its header ({dtype} {tuple(shape)}) "
                f"says {expected:,} (cut short or written over)")
    return None
