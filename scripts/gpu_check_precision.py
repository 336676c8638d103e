"""GPU check: the precision presets, packed THD on TE, speed and memory against the plan.

usage: python scripts/gpu_check_precision.py [steps=50] [smoke_steps=10] [out=DIR] [install_te=true]

On a GPU node it trains one small GPT (8 layers, hidden 1024, FFN 4096, 1024-token rows, the
standard-library BPE data) through scripts/pretrain.py, the way a user would:

  bf16, fp8_current           `steps` steps on concatenated rows; prints both final losses, the
                              difference of the last-10-step means, and tokens/s of each
  bf16_thd, fp8_current_thd   the same model on packed THD rows (`data.documents=packed`), which
                              only Transformer Engine's attention accepts on GPU (Megatron's local
                              attention refuses packed sequences), so these runs prove TE's path
  smoke runs                  `smoke_steps` steps each of FP8 delayed scaling, FP8 current with
                              bf16 end layers, FP8 blockwise, MXFP8 and fp16, and on a tiny
                              Nemotron-H-shaped hybrid FP8 as NVIDIA pretrained Nemotron-H
                              (tensorwise, 2 + 2 BF16 end layers, FP8 parameters) and Nano v2
                              (the same, blockwise E4M3): each either trains or is refused with
                              the one line the machine check gives (MXFP8 on compute capability
                              < 10.0, blockwise on < 9.0, FP8 parameters on Transformer Engine
                              < 2.2, Mamba layers without mamba-ssm)

Each run also reports its model TFLOP/s per GPU and MFU against conf/cluster/h200_1x8.yaml's
peak, and its peak allocated memory (torch.cuda.max_memory_allocated) against the planner's
worst rank for the same config (goal within 10%); the BF16 runs must show every GPU fusion on
(their `layers: Transformer Engine's; fusions on: ...` line). Without Transformer Engine it
trains the BF16 model on Megatron's local layers (speed, MFU, memory against the plan) and says
why the rest cannot run. `bash scripts/run_gpu_checks.sh` runs this and the tests/gpu tier.

With two GPUs it also trains FP8 current scaling on TP2 + sequence parallel and compares it with
the one-GPU FP8 run; with one GPU it lists what needs more. Where it cannot run at all (no GPU,
torch without CUDA; no or a broken Transformer Engine after the local-layer run) it prints one
line saying exactly why and exits 2; `install_te=true` first tries to install TE and reports
why that failed.
Exit 0: everything this machine can check passed; 1: a run failed or FP8 drifted from BF16.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import GPU_CHECK_PRECISION  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(GPU_CHECK_PRECISION))
