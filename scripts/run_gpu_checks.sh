#!/usr/bin/env bash
# Every check that needs a GPU, in one command: the tests/gpu tier (among them the CPU Mamba
# kernels against mamba-ssm's and causal-conv1d's, the GPU fast paths: a tiny MoE and a tiny
# hybrid MoE with grouped GEMM, permute fusion and CUDA graphs against without them, tokens/s of
# each, a Megatron FSDP step and an optimizer-offload step against the planner's peak memory,
# and the tiny Nemotron 3 Super-shaped hybrid in BF16),
# then the GPU check scripts (the precision presets; NVFP4, on the tiny Super too, trains on
# Blackwell only and is refused elsewhere in one line). On a GPU machine without Transformer
# Engine or the Mamba kernels it fails, one line naming what is missing: the tier checks what
# they run. A machine without network installs them first from wheels brought along: WHEELS=dir
# (default shared/wheels when it exists; every wheel in it, pip --no-index --no-deps).
# Usage: bash scripts/run_gpu_checks.sh [-h|--help]
#   PYTHON=...  another interpreter (default .venv/bin/python, else python3 where the checkout
#               has no .venv); STEPS=N (default 50). The first line printed names the
#               interpreter, its torch and the versions of the packages the checks need.
#   WHEELS=dir  the wheel folder; a relative PYTHON or WHEELS is taken from the directory the
#               command is run in, the defaults from the repository root
set -uo pipefail
usage() { sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
for arg in "$@"; do
  case $arg in
    -h|--help) usage; exit 0 ;;
    *) echo "error: $arg is not an option of run_gpu_checks.sh; it takes none but -h/--help" \
         "(settings go in the environment: PYTHON=, WHEELS=, STEPS=)" >&2; exit 2 ;;
  esac
done
here=$PWD
absolute() { case $1 in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
if [ -n "${PYTHON:-}" ]; then
  case $PYTHON in */*) python=$(absolute "$PYTHON") ;; *) python=$PYTHON ;; esac
fi
if [ -n "${WHEELS:-}" ]; then wheels=$(absolute "$WHEELS"); fi
[[ "${STEPS:-50}" =~ ^[1-9][0-9]*$ ]] || { echo "error: STEPS=$STEPS is not a positive whole" \
  "number; give e.g. STEPS=50" >&2; exit 2; }
cd "$(dirname "$0")/.."
# A checkout's own environment where it has one; else the machine's python3 (a copy of the tree
# sent to a GPU machine carries no .venv, and its image's python3 is the one holding torch).
if [ -z "${python:-}" ]; then
  python=python3
  [ -x .venv/bin/python ] && python=.venv/bin/python
fi
# Output reaches a pipe (tee to a log) as it is printed, so a run stopped at a time limit keeps
# every figure printed before the stop.
export PYTHONUNBUFFERED=1
wheels=${wheels:-shared/wheels}
"$python" -c '' 2>/dev/null || { echo "error: PYTHON=$python cannot be run; set PYTHON to a" \
  "Python interpreter, e.g. PYTHON=.venv/bin/python (the default where the checkout has a" \
  ".venv, else python3)" >&2
  exit 2; }
if [ -n "${WHEELS:-}" ] && ! compgen -G "$wheels/*.whl" >/dev/null; then
  what="is not a folder"; [ -d "$wheels" ] && what="holds no .whl files"
  echo "error: WHEELS=$wheels $what; fill it on a machine with network: TORCH=x.y.z ARCH=m.n bash" \
       "scripts/build_gpu_wheels.sh $wheels (docs/testing.md), or unset WHEELS" >&2
  exit 2
fi
packages=(transformer_engine mamba_ssm causal_conv1d)
missing() {
  for module in "${packages[@]}"; do
    "$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)" \
      || echo "$module"
  done
}
if [ -n "$(missing)" ] && compgen -G "$wheels/*.whl" >/dev/null; then
  # Every wheel in the folder as it is, without resolving dependencies: an offline machine has
  # no index to resolve against, and mamba-ssm declares optional kernels (tilelang, quack) it
  # only try-imports. Bring what the machine lacks (docs/testing.md, "A GPU machine without
  # network").
  "$python" -m pip install --no-index --no-deps "$wheels"/*.whl || true
fi
# What runs the checks, in one line: the wheels' cp312 tag needs Python 3.12, TE's extension and
# the Mamba kernels the torch they were built against.
"$python" - <<'EOF' || true
import importlib.metadata as metadata
import platform
import sys


def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"


try:
    import torch
    found = (f"torch {torch.__version__} (CUDA {torch.version.cuda}, "
             f"{torch.cuda.device_count()} GPUs)")
except ImportError:
    found = "torch missing"
names = ("transformer_engine", "transformer_engine_torch", "mamba_ssm", "causal_conv1d",
         "megatron-core", "omegaconf")
print(f"run_gpu_checks: Python {platform.python_version()} ({sys.executable}), {found}; "
      + ", ".join(f"{name} {version(name)}" for name in names), flush=True)
EOF
if nvidia-smi -L >/dev/null 2>&1 && [ -n "$(missing)" ]; then
  echo "error: this GPU machine lacks $(missing | tr '\n' ' ')(the fast paths and the hybrid's" \
       "kernels); install the gpu extra or bring wheels: WHEELS=dir bash scripts/run_gpu_checks.sh" >&2
  exit 1
fi
status=0
"$python" -m pytest -q -p no:cacheprovider tests/gpu || status=1
"$python" scripts/gpu_check_precision.py "steps=${STEPS:-50}" smoke_steps=10 || status=1
exit "$status"
