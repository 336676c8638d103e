#!/usr/bin/env bash
# Build the wheel folder a GPU machine without network installs from before its checks
# (WHEELS=dir bash scripts/run_gpu_checks.sh): Transformer Engine (its core library and the
# Python packages it needs), its PyTorch extension, causal-conv1d and mamba-ssm compiled against
# the GPU machine's torch for its GPUs only, and the packages of ours a bare PyTorch image lacks.
# Runs on a machine with network, nvcc of the same CUDA major as that torch and Python 3.12; the
# three compiled packages take about 20 minutes on 2 cores (docs/testing.md).
# Usage: TORCH=2.11.0 ARCH=9.0 bash scripts/build_gpu_wheels.sh [OUT]   (OUT: shared/wheels)
#        bash scripts/build_gpu_wheels.sh -h|--help   (this text)
#   OUT    the wheel folder, created if missing; a relative OUT (WORK, PYTHON) is taken from
#          the directory the command is run in, the default from the repository root
#   TORCH  the GPU machine's torch version (python3 -c 'import torch; print(torch.__version__)')
#   ARCH   its GPUs' compute capability (nvidia-smi --query-gpu=compute_cap --format=csv)
#   SLIM=1 keeps only ARCH's kernels in TE's core library (its wheel 277 MB -> 32 MB) and
#          recompresses every wheel with LZMA, for a machine the wheels reach through a
#          size-limited transfer
#   TE=2.20.2 CAUSAL_CONV1D=1.7.0 MAMBA_SSM=2.3.2.post1 PYTHON=python3.12 WORK=<tmp> MAX_JOBS=2
#   EXTRA="megatron-core==0.19.2 omegaconf==2.4.0" (OmegaConf 2.3 cannot read the config's
#          Literal fields)
set -euo pipefail
die() { echo "error: $*" >&2; exit 2; }
usage() { sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
case ${1:-} in
  -h|--help) usage; exit 0 ;;
  -*) die "$1 is not an option of build_gpu_wheels.sh; it takes -h/--help or the output folder" \
        "OUT (a folder whose name starts with - : write ./$1)" ;;
esac
[ $# -le 1 ] || die "build_gpu_wheels.sh takes one output folder, got $#: $*; give one, e.g." \
  "bash scripts/build_gpu_wheels.sh shared/wheels"
here=$PWD
absolute() { case $1 in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
out=shared/wheels
if [ -n "${1:-}" ]; then out=$(absolute "$1"); fi
if [ -n "${WORK:-}" ]; then WORK=$(absolute "$WORK"); fi
case ${PYTHON:-} in */*) PYTHON=$(absolute "$PYTHON") ;; esac
cd "$(dirname "$0")/.."

torch_version=${TORCH:-}
arch=${ARCH:-}
te=${TE:-2.20.2}
causal_conv1d=${CAUSAL_CONV1D:-1.7.0}
mamba_ssm=${MAMBA_SSM:-2.3.2.post1}
extra=${EXTRA:-megatron-core==0.19.2 omegaconf==2.4.0}
python=${PYTHON:-python3.12}
slim=${SLIM:-0}
export MAX_JOBS=${MAX_JOBS:-2}

[ -n "$torch_version" ] || die "TORCH is not set; give the GPU machine's torch version, e.g." \
  "TORCH=2.11.0 ARCH=9.0 bash scripts/build_gpu_wheels.sh"
[[ "$torch_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "TORCH=$torch_version is not a" \
  "release version; write it as x.y.z, e.g. TORCH=2.11.0"
[[ "$slim" =~ ^[01]$ ]] || die "SLIM=$slim must be 0 or 1"
[[ "$arch" =~ ^[0-9]+\.[0-9]+$ ]] || die "ARCH='$arch' is not a compute capability; write it" \
  "as major.minor, e.g. ARCH=9.0 for H100/H200 (nvidia-smi --query-gpu=compute_cap --format=csv)"
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
  || die "PYTHON=$python is not Python 3.12 (the wheels' tag); set PYTHON=/path/to/python3.12"
command -v nvcc >/dev/null || die "nvcc is not on PATH; install the CUDA toolkit of the GPU" \
  "machine's CUDA major, or put its bin/ on PATH"

work=${WORK:-$(mktemp -d)}
venv="$work/venv"
mkdir -p "$out" "$work/src"
out=$(cd "$out" && pwd)
started=$SECONDS
step() { echo "[$(( (SECONDS - started) / 60 )) min] $*"; }

step "build environment: torch==$torch_version in $venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==$torch_version" numpy ninja packaging wheel \
  setuptools pybind11 psutil
pip() { "$venv/bin/python" -m pip "$@"; }
edit() { PYTHONPATH="$PWD" "$venv/bin/python" -m trainer.tools.gpu_wheels "$1" "$2" "$arch"; }

cuda_major=$("$venv/bin/python" -c 'import torch; print((torch.version.cuda or "").split(".")[0])')
[ -n "$cuda_major" ] || die "torch==$torch_version from the index is a CPU build; the GPU" \
  "machine's is a CUDA build: install its CUDA build into PYTHON's index first"
nvcc_major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
[ "$nvcc_major" = "$cuda_major" ] || die "nvcc is CUDA $nvcc_major, torch==$torch_version is" \
  "built with CUDA $cuda_major; put a CUDA $cuda_major toolkit's nvcc first on PATH"

# The toolkit nvcc belongs to (a wrapper script on PATH would make torch look in its folder).
CUDA_HOME=${CUDA_HOME:-$(cd "$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 \
  | sed -n 's/^#\$ TOP=//p')" && pwd)}
export CUDA_HOME
# Headers torch's extension build includes that a bare toolkit may lack: the pip packages of
# cuDNN, NCCL and the CUDA libraries that came with torch carry them.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for include in "$site"/nvidia/*/include; do
  [ -d "$include" ] && CPATH="$include${CPATH:+:$CPATH}"
done
export CPATH

step "binary wheels: Transformer Engine $te core (CUDA $cuda_major), its Python needs, $extra"
pip download -q --no-deps --only-binary :all: -d "$out" "transformer_engine==$te" \
  "transformer_engine_cu$cuda_major==$te" pydantic pydantic-core annotated-types \
  typing-inspection nvdlfw-inspect "typing-extensions>=4.14"  # pydantic's Sentinel: 4.14 on
# A wheel of each, built where the index has only a source archive.
# shellcheck disable=SC2086  # EXTRA is a list of requirements
pip wheel -q --no-deps -w "$out" $extra
pip install -q --no-deps "$out"/transformer_engine-"$te"*.whl \
  "$out"/transformer_engine_cu"$cuda_major"-"$te"*.whl

if [ "$slim" = 1 ]; then
  step "Transformer Engine's core library cut to sm_${arch/./} kernels (SLIM=1)"
  core=$(ls "$out"/transformer_engine_cu"$cuda_major"-"$te"-*.whl)
  rm -rf "$work/core"
  "$venv/bin/python" -m wheel unpack -d "$work/core" "$core" >/dev/null
  edit fatbin "$(ls "$work"/core/*/transformer_engine/wheel_lib/libtransformer_engine.so)"
  rm "$core" && "$venv/bin/python" -m wheel pack -d "$out" "$work"/core/* >/dev/null
fi

step "Transformer Engine's PyTorch extension for sm_${arch/./} (about 8 minutes on 2 cores)"
NVTE_CUDA_ARCHS=${arch/./} NVTE_WITH_NCCL_EP=0 \
  pip wheel -q --no-build-isolation --no-deps -w "$out" "transformer_engine_torch==$te"

build_kernel() {  # name version FORCE_BUILD-variable
  local name=$1 version=$2 force=$3
  step "$name $version for sm_${arch/./} (about 4 to 8 minutes on 2 cores)"
  pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$work/src" \
    "$name==$version"
  local tarball
  tarball=$(ls "$work/src"/"${name//-/_}"-"$version".tar.gz)
  tar -xzf "$tarball" -C "$work/src"
  # Its setup.py hands nvcc every architecture from sm_75 on, whatever TORCH_CUDA_ARCH_LIST
  # says: keep ARCH's pair alone, or the build takes an hour (trainer/tools/gpu_wheels.py).
  edit gencode "${tarball%.tar.gz}/setup.py"
  env "$force=TRUE" TORCH_CUDA_ARCH_LIST="$arch" \
    "$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w "$out" \
    "${tarball%.tar.gz}"
}
build_kernel causal-conv1d "$causal_conv1d" CAUSAL_CONV1D_FORCE_BUILD
build_kernel mamba-ssm "$mamba_ssm" MAMBA_FORCE_BUILD

if [ "$slim" = 1 ]; then
  step "every wheel recompressed with LZMA (SLIM=1)"
  for wheel in "$out"/*.whl; do
    PYTHONPATH="$PWD" "$venv/bin/python" -m trainer.tools.gpu_wheels recompress "$wheel"
  done
fi

step "done: $(find "$out" -name '*.whl' | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
ls -1 "$out"
echo "on the GPU machine: WHEELS=$out bash scripts/run_gpu_checks.sh"
