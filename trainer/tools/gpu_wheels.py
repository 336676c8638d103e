"""The edits `scripts/build_gpu_wheels.sh` makes to what it builds for one GPU architecture.

- `only_arch_gencode`: causal-conv1d's and mamba-ssm's `setup.py` hand nvcc a `-gencode` pair
  for every architecture from sm_75 on, whatever `TORCH_CUDA_ARCH_LIST` says; keeping the GPU's
  own pair is what makes each build minutes instead of an hour.
- `clear_other_archs`: Transformer Engine's core library (`libtransformer_engine.so`, 343 MB in
  2.20.2 for CUDA 13) is mostly compiled kernels for eight architectures. For a machine the
  wheels reach through a size-limited transfer, the kernels of every other architecture are
  zeroed in place (their headers kept, so every offset stays valid and CUDA still finds the
  GPU's own), and the repacked wheel compresses from 277 MB to 32 MB.
- `recompress`: a wheel is a zip archive, compressed with deflate; the same files compressed
  with LZMA, which pip reads like any zip, take about a tenth less for the compiled wheels
  (TE's slim core 32.4 -> 27.3 MB, causal-conv1d 25.4 -> 23.6 MB). With a transfer of 64 MiB a
  call, that is what lets every wheel but mamba-ssm's travel in one call and mamba-ssm's in a
  second. The files and RECORD's hashes (of the files, not of their compressed bytes) are kept.

Standard library only: the build script runs it with its build environment's Python.
Usage: python -m trainer.tools.gpu_wheels gencode|fatbin FILE ARCH   (ARCH: 9.0 or 90)
       python -m trainer.tools.gpu_wheels recompress WHEEL
"""

from __future__ import annotations

import os
import re
import struct
import sys
import zipfile
from pathlib import Path

GENCODE_PAIR = re.compile(r'cc_flag\.append\("-gencode"\)(\s*)'
                          r'cc_flag\.append\("arch=compute_(\d+),code=sm_\d+a?"\)')
FATBIN_MAGIC = 0xBA55ED50
CUBIN = 2  # a fatbin entry's kind: 1 is PTX, 2 a compiled kernel image (cubin)


class WheelEditError(Exception):
    """A file is not what the edit expects (its package changed); the message says which."""


def arch_number(arch: str) -> int:
    """`9.0` or `90` -> 90."""
    return int(arch.replace(".", ""))


def only_arch_gencode(text: str, arch: int) -> str:
    """`setup.py` text with every `-gencode` pair but `arch`'s replaced by `pass` statements."""
    def keep_or_drop(match: re.Match) -> str:
        return match.group(0) if int(match.group(2)) == arch else f"pass{match.group(1)}pass"

    trimmed, pairs = GENCODE_PAIR.subn(keep_or_drop, text)
    if pairs == 0 or f"compute_{arch}," not in trimmed:
        raise WheelEditError(f"no -gencode pair for sm_{arch} among {pairs}; the package's "
                             "setup.py changed: build it with its own list")
    return trimmed


def _section(data: bytes | bytearray, name: str) -> tuple[int, int]:
    """(offset, size) of an ELF64 little-endian section, by name."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise WheelEditError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(index: int) -> tuple:
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + index * shentsize)

    names = header(shstrndx)[4]
    for index in range(shnum):
        fields = header(index)
        start = names + fields[0]
        if bytes(data[start:data.index(b"\0", start)]).decode() == name:
            return fields[4], fields[5]
    raise WheelEditError(f"no {name} section")


def clear_other_archs(data: bytearray, arch: int) -> tuple[int, int]:
    """Zero, in `data` (a shared library's bytes), the kernel images of every architecture
    but `arch` in its `.nv_fatbin` section. Returns (bytes kept, bytes cleared)."""
    start, size = _section(data, ".nv_fatbin")
    pos, kept, cleared = start, 0, 0
    while pos + 16 <= start + size:
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:  # alignment padding between fatbins
            pos += 8
            continue
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            entry_arch, = struct.unpack_from("<I", data, entry + 28)
            body = entry + entry_header
            if kind == CUBIN and entry_arch != arch:
                data[body:body + payload] = bytes(payload)
                cleared += payload
            elif kind == CUBIN:
                kept += payload
            entry = body + payload
        pos = end
    if kept == 0:
        raise WheelEditError(f"no kernel image for sm_{arch}: the library does not support "
                             "this GPU")
    return kept, cleared


def recompress(wheel: Path) -> tuple[int, int]:
    """Rewrite `wheel` in place with every file LZMA-compressed, in the same order, with the
    same names, times and permissions. Returns (bytes before, bytes after)."""
    before = wheel.stat().st_size
    partial = wheel.with_name(wheel.name + ".partial")
    with zipfile.ZipFile(wheel) as source, \
            zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_LZMA) as target:
        for info in source.infolist():
            copy = zipfile.ZipInfo(info.filename, info.date_time)
            copy.external_attr = info.external_attr
            copy.compress_type = zipfile.ZIP_LZMA
            target.writestr(copy, source.read(info))
    os.replace(partial, wheel)
    return before, wheel.stat().st_size


def _usage() -> int:
    print("\n".join(__doc__.strip().splitlines()[-2:]), file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "recompress":
        try:
            before, after = recompress(Path(argv[1]))
        except (OSError, zipfile.BadZipFile) as error:
            print(f"error: {argv[1]}: {error}; give a wheel file", file=sys.stderr)
            return 2
        print(f"{Path(argv[1]).name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB (LZMA)")
        return 0
    if len(argv) != 3 or argv[0] not in ("gencode", "fatbin"):
        return _usage()
    what, path, arch = argv[0], Path(argv[1]), arch_number(argv[2])
    try:
        if what == "gencode":
            path.write_text(only_arch_gencode(path.read_text(), arch))
            return 0
        data = bytearray(path.read_bytes())
        kept, cleared = clear_other_archs(data, arch)
    except WheelEditError as error:
        print(f"error: {path}: {error}", file=sys.stderr)
        return 2
    path.write_bytes(data)
    print(f"{path.name}: kept {kept / 2**20:.0f} MiB of sm_{arch} kernels, zeroed "
          f"{cleared / 2**20:.0f} MiB of other architectures'")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
