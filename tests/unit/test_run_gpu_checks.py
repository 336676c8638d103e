"""`scripts/run_gpu_checks.sh` before any GPU work: on a GPU machine (here a stand-in
`nvidia-smi` on PATH) without Transformer Engine or the Mamba kernels it fails in one line, and
with `WHEELS=dir` it first installs every wheel of the folder as it is (an offline machine has
no index to resolve dependencies against)."""

from __future__ import annotations

import os
import subprocess
import venv
import zipfile
from pathlib import Path

from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "run_gpu_checks.sh"
PACKAGES = ("transformer_engine", "mamba_ssm", "causal_conv1d")


def _gpu_machine(tmp_path: Path, python: str, wheels: Path | None) -> dict[str, str]:
    """The environment of a GPU machine: `nvidia-smi -L` lists a GPU; `WHEELS` unset when
    `wheels` is None (the default folder, shared/wheels, is absent in a checkout)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "WHEELS"}
    return {**env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": python, "STEPS": "1",
            **({"WHEELS": str(wheels)} if wheels is not None else {})}


def _wheel(folder: Path, name: str, requires: str) -> None:
    """A one-module wheel of `name` that declares a dependency no index here could resolve."""
    dist = f"{name}-0.0.1.dist-info"
    files = {f"{name}/__init__.py": "",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n"
                                 f"Requires-Dist: {requires}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-0.0.1-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


def test_a_gpu_machine_without_the_packages_fails_in_one_line(tmp_path):
    # An interpreter with the standard library only, so the three are missing on any machine
    # (this one may have them all, and the script would go on to the GPU tier).
    env_dir = tmp_path / "bare"
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")
    missing = [name for name in PACKAGES if subprocess.run(
        [python, "-c", f"import {name}"], capture_output=True, timeout=HANG_S).returncode]
    assert missing == list(PACKAGES)
    env = _gpu_machine(tmp_path, python, None)
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=HANG_S)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.startswith(f"error: this GPU machine lacks {' '.join(missing)} ")
    assert len(done.stderr.strip().splitlines()) == 1
    assert "WHEELS=dir bash scripts/run_gpu_checks.sh" in done.stderr


def test_wheels_brought_along_are_installed_as_they_are(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in PACKAGES:
        _wheel(wheels, name, requires="a-package-no-index-has>=1")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    done = subprocess.run(["bash", str(SCRIPT)], env=_gpu_machine(tmp_path, python, wheels),
                          capture_output=True, text=True, timeout=HANG_S)
    assert "lacks" not in done.stderr, done.stderr[-2000:]
    found = subprocess.run(
        [python, "-c", "import transformer_engine, mamba_ssm, causal_conv1d; print('found')"],
        capture_output=True, text=True, timeout=HANG_S)
    assert found.stdout.strip() == "found", found.stderr
    # No pytest in that environment: the tier itself fails, and so does the script.
    assert done.returncode == 1
