#!/usr/bin/env bash
# Every check that needs a GPU, in one command (at most about 10 minutes on one H200): the
# tests/gpu tier (among them the CPU Mamba kernels against mamba-ssm's and causal-conv1d's, the
# GPU fast paths: a tiny MoE and a tiny hybrid MoE with grouped GEMM, permute fusion and CUDA
# graphs against without them, tokens/s of each, a Megatron FSDP step and an optimizer-offload
# step against the planner's peak memory, and the tiny Nemotron 3 Super-shaped hybrid in BF16),
# then the GPU check scripts (the precision presets; NVFP4, on the tiny Super too, trains on
# Blackwell only and is refused elsewhere in one line). On a GPU machine without Transformer
# Engine or the Mamba kernels it fails, one line naming what is missing: the tier checks what
# they run. A machine without network installs them first from wheels brought along: WHEELS=dir
# (default shared/wheels when it exists; every wheel in it, pip --no-index --no-deps).
# Usage: bash scripts/run_gpu_checks.sh   (PYTHON=... to use another interpreter; STEPS=N)
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
wheels=${WHEELS:-shared/wheels}
packages=(transformer_engine mamba_ssm causal_conv1d)
missing() {
  for module in "${packages[@]}"; do
    "$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)" \
      || echo "$module"
  done
}
if [ -n "$(missing)" ] && [ -d "$wheels" ]; then
  # Every wheel in the folder as it is, without resolving dependencies: an offline machine has
  # no index to resolve against, and mamba-ssm declares optional kernels (tilelang, quack) it
  # only try-imports. Bring what the machine lacks (docs/testing.md, "A GPU machine without
  # network").
  "$python" -m pip install --no-index --no-deps "$wheels"/*.whl || true
fi
if nvidia-smi -L >/dev/null 2>&1 && [ -n "$(missing)" ]; then
  echo "error: this GPU machine lacks $(missing | tr '\n' ' ')(the fast paths and the hybrid's" \
       "kernels); install the gpu extra or bring wheels: WHEELS=dir bash scripts/run_gpu_checks.sh" >&2
  exit 1
fi
status=0
"$python" -m pytest -q -p no:cacheprovider tests/gpu || status=1
"$python" scripts/gpu_check_precision.py "steps=${STEPS:-50}" smoke_steps=10 || status=1
exit "$status"
