#!/usr/bin/env bash
# Every check that needs a GPU, in one command (at most about 10 minutes on one H200): the
# tests/gpu tier (among them the CPU Mamba kernels against mamba-ssm's and causal-conv1d's, and
# the tiny Nemotron 3 Super-shaped hybrid in BF16), then the GPU check scripts (the precision
# presets; NVFP4, on the tiny Super too, trains on Blackwell only and is refused elsewhere in one
# line). Each says in one line what it cannot run and why.
# Usage: bash scripts/run_gpu_checks.sh   (PYTHON=... to use another interpreter; STEPS=N)
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
status=0
"$python" -m pytest -q -p no:cacheprovider tests/gpu || status=1
"$python" scripts/gpu_check_precision.py "steps=${STEPS:-50}" smoke_steps=10 || status=1
exit "$status"
