"""A real `scripts/launch.py executor=local` run of tiny_dp2 (two gloo ranks, 4 steps): its run
directory is `<output_dir>/tiny_dp2-<time>` (not named after torchrun's run id), the ranks'
losses and run summary reach the terminal as they train, and the last line names the run
directory and the job's log, which holds the same output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import HANG_S

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]


def test_a_local_launch_shows_its_run_and_names_its_directory_and_log(tmp_path):
    pytest.importorskip("nemo_run")
    out_dir = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "launch.py"), "recipe=tiny_dp2",
         f"cluster={REPO / 'conf' / 'cluster' / 'cpu_local.yaml'}", "executor=local",
         "train.train_iters=4", "scheduler.warmup_iters=1", f"output_dir={out_dir}",
         f"job_dir={tmp_path / 'jobs'}"],
        cwd=REPO, capture_output=True, text=True, timeout=HANG_S,
        env={**os.environ, "NEMORUN_HOME": str(tmp_path / "home")})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    [run_dir] = list(out_dir.iterdir())
    assert re.fullmatch(r"tiny_dp2-\d{8}-\d{6}", run_dir.name)
    assert (run_dir / "config.yaml").is_file()
    assert "step     4/4 | loss " in out and "run summary: tiny_dp2" in out
    assert "Using nproc_per_node" not in out  # torchrun's INFO lines are quiet
    last = re.search(r"^pretrain under NeMo-Run's local executor: SUCCEEDED; run directory: "
                     r"(\S+); its log: (\S+)$", out, re.M)
    assert last and last.group(1) == str(run_dir)
    assert "run summary: tiny_dp2" in Path(last.group(2)).read_text()
