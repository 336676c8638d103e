"""The two edits the GPU wheel build makes (`trainer/tools/gpu_wheels.py`), on files of the
shape the real packages have: a setup.py's `-gencode` pairs cut to one architecture, and a
shared library's kernel images of other architectures zeroed with every header kept. The
script's own argument checks are one line, exit 2, before anything is downloaded."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from trainer.tools.gpu_wheels import (
    FATBIN_MAGIC,
    WheelEditError,
    arch_number,
    clear_other_archs,
    main,
    only_arch_gencode,
)

REPO = Path(__file__).resolve().parents[2]

SETUP = '''
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_75,code=sm_75")
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_80,code=sm_80")
        if bare_metal_version >= Version("11.8"):
            cc_flag.append("-gencode")
            cc_flag.append("arch=compute_90,code=sm_90")
        if bare_metal_version >= Version("12.8"):
            cc_flag.append("-gencode")
            cc_flag.append("arch=compute_100,code=sm_100")
'''


def test_only_the_gpus_gencode_pair_is_left():
    trimmed = only_arch_gencode(SETUP, 90)
    assert trimmed.count('cc_flag.append("-gencode")') == 1
    assert 'cc_flag.append("arch=compute_90,code=sm_90")' in trimmed
    assert "compute_75" not in trimmed and "compute_100" not in trimmed
    compile(trimmed.replace("\n        ", "\n"), "setup.py", "exec")  # still Python: pass


def test_a_setup_py_without_the_gpus_pair_is_refused():
    with pytest.raises(WheelEditError, match="no -gencode pair for sm_86 among 4"):
        only_arch_gencode(SETUP, 86)


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    """One fatbin: its header, then each (kind, arch, payload) behind a 64-byte entry header."""
    body = b""
    for kind, arch, payload in entries:
        header = struct.pack("<HHIQ", kind, 0x0101, 64, len(payload)).ljust(28, b"\0")
        body += (header + struct.pack("<I", arch)).ljust(64, b"\0") + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def _elf_with(fatbin: bytes) -> bytearray:
    """A minimal ELF64 file: header, a name table, the .nv_fatbin section, section headers."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    names_at = 64
    fatbin_at = names_at + len(names) + 8  # padding between fatbins is skipped
    shoff = fatbin_at + len(fatbin)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)

    def section(name: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, offset, size, 0, 0, 1, 0)

    sections = (bytes(64) + section(1, names_at, len(names))
                + section(11, fatbin_at - 8, len(fatbin) + 8))
    return bytearray(header + names + bytes(8) + fatbin + sections)


def test_other_architectures_kernels_are_zeroed_and_the_gpus_kept():
    sm80, sm90, ptx = b"\x80" * 100, b"\x90" * 50, b"ptx-for-compute-80"
    data = _elf_with(_fatbin([(2, 80, sm80), (2, 90, sm90), (1, 80, ptx)]))
    size = len(data)
    assert clear_other_archs(data, 90) == (50, 100)
    assert len(data) == size  # every offset stays where it was
    assert sm80 not in data and sm90 in data and ptx in data
    assert struct.pack("<I", 80) in data  # the cleared entry's header is kept


def test_a_library_without_the_gpus_kernels_or_a_fatbin_is_refused():
    with pytest.raises(WheelEditError, match="no kernel image for sm_90"):
        clear_other_archs(_elf_with(_fatbin([(2, 80, b"x" * 8)])), 90)
    with pytest.raises(WheelEditError, match="not a 64-bit little-endian ELF file"):
        clear_other_archs(bytearray(b"PK\x03\x04" + bytes(60)), 90)


def test_the_command_edits_the_file_or_says_why_not(tmp_path, capsys):
    library = tmp_path / "lib.so"
    library.write_bytes(_elf_with(_fatbin([(2, 80, b"\x80" * 8), (2, 90, b"\x90" * 8)])))
    assert main(["fatbin", str(library), "9.0"]) == 0
    assert b"\x80" * 8 not in library.read_bytes()
    setup = tmp_path / "setup.py"
    setup.write_text(SETUP)
    assert main(["gencode", str(setup), "8.6"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {setup}: no -gencode pair for sm_86")
    assert arch_number("9.0") == arch_number("90") == 90


@pytest.mark.parametrize("env, said", [
    ({}, "error: TORCH is not set; give the GPU machine's torch version"),
    ({"TORCH": "2.11"}, "error: TORCH=2.11 is not a release version; write it as x.y.z"),
    ({"TORCH": "2.11.0", "ARCH": "9.0", "SLIM": "yes"}, "error: SLIM=yes must be 0 or 1"),
    ({"TORCH": "2.11.0", "ARCH": "sm90"}, "error: ARCH='sm90' is not a compute capability"),
    ({"TORCH": "2.11.0", "ARCH": "9.0", "PYTHON": "/nonexistent/python"},
     "error: PYTHON=/nonexistent/python is not Python 3.12"),
])
def test_the_build_scripts_mistakes_are_one_line_before_any_download(tmp_path, env, said):
    done = subprocess.run(["bash", str(REPO / "scripts" / "build_gpu_wheels.sh"),
                           str(tmp_path / "wheels")], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], **env}, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "wheels").exists()


def _tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of one module, deflate-compressed as pip's builders write them."""
    import base64
    import hashlib
    import zipfile

    files = {"tinypkg.py": b"VALUE = 'kept'\n" * 200,
             "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\n"
                                               b"Version: 1.0\n",
             "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                            b"Root-Is-Purelib: true\nTag: py3-none-any\n"}

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{name},sha256={digest(data)},{len(data)}\n" for name, data in files.items())
    files["tinypkg-1.0.dist-info/RECORD"] = (record + "tinypkg-1.0.dist-info/RECORD,,\n").encode()
    wheel = folder / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def test_recompress_keeps_every_file_and_pip_installs_the_wheel(tmp_path):
    import sys
    import zipfile

    from trainer.tools.gpu_wheels import recompress

    wheel = _tiny_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        before = [(i.filename, archive.read(i)) for i in archive.infolist()]
    assert main(["recompress", str(wheel)]) == 0
    with zipfile.ZipFile(wheel) as archive:
        infos = archive.infolist()
        assert [(i.filename, archive.read(i)) for i in infos] == before
        assert {i.compress_type for i in infos} == {zipfile.ZIP_LZMA}
    assert not list(tmp_path.glob("*.partial"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "tinypkg.py").read_bytes() == b"VALUE = 'kept'\n" * 200
    assert recompress(wheel)[0] == wheel.stat().st_size  # a second pass: the same archive size


def test_recompress_of_a_file_that_is_no_wheel_is_one_line(tmp_path, capsys):
    text = tmp_path / "notes.whl"
    text.write_text("not a zip")
    assert main(["recompress", str(text)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {text}: File is not a zip file; give a wheel file")
    assert err.count("\n") == 1 and text.read_text() == "not a zip"
