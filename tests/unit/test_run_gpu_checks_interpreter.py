"""`scripts/run_gpu_checks.sh` in a copy of the tree without `.venv` (what a GPU machine gets:
ignored files do not travel) runs the machine's `python3`, and its first line of output names
the interpreter, its torch and the packages the checks need, so a log shows what ran."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]


def test_a_checkout_without_a_venv_runs_python3_and_names_it_first(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "run_gpu_checks.sh", checkout / "scripts")
    # The machine's python3: an interpreter with the standard library only, first on PATH.
    machine = tmp_path / "machine"
    venv.create(machine, with_pip=False)
    # A GPU machine: `nvidia-smi -L` lists a GPU.
    smi = machine / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHON", "WHEELS", "STEPS")}
    env["PATH"] = f"{machine / 'bin'}:{env['PATH']}"
    done = subprocess.run(["bash", str(checkout / "scripts" / "run_gpu_checks.sh")], env=env,
                          capture_output=True, text=True, timeout=HANG_S)
    # It got as far as the package check, with that interpreter.
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.startswith("error: this GPU machine lacks transformer_engine mamba_ssm "
                                  "causal_conv1d ")
    first = done.stdout.splitlines()[0]
    assert first.startswith("run_gpu_checks: Python 3.12.")
    assert f"({machine / 'bin' / 'python3'}), torch missing; " in first
    assert first.endswith("transformer_engine missing, transformer_engine_torch missing, "
                          "mamba_ssm missing, causal_conv1d missing, megatron-core missing, "
                          "omegaconf missing")
