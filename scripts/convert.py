"""Convert between Hugging Face models and this project's Megatron checkpoints, both ways.

usage: python scripts/convert.py import hf=DIR out=DIR recipe=NAME [section.field=value ...]
       python scripts/convert.py export checkpoint=DIR out=DIR [max_shard_size=BYTES]

  python scripts/convert.py import hf=~/models/Meta-Llama-3-8B out=ckpt/llama3-8b \\
      recipe=llama3_8b_tp8_dp8
  python scripts/pretrain.py recipe=llama3_8b_tp8_dp8 checkpoint.load=ckpt/llama3-8b \\
      checkpoint.load_model_only=true
  python scripts/convert.py export checkpoint=runs/<run>/checkpoints out=hf/my-model

import:
  hf=          a local Hugging Face model directory: config.json and *.safetensors (one file,
               or shards with model.safetensors.index.json) of an architecture listed below
  recipe=      the recipe you will train (or config=FILE); its model must be the HF model's
               shape (each differing field is named), and its layout sets the vocabulary padding
               (make_vocab_size_divisible_by x TP): load the checkpoint into layouts that pad
               alike. Overrides (model.*, parallel.*, cluster.*) apply as in pretrain.py:
               a TP the recipe's cluster cannot hold needs cluster.* too (parallel.tensor=2
               cluster.gpus_per_node=2).
  out=         a new directory: a Megatron torch_dist checkpoint (loads into any TP/PP/VPP/EP
               layout with checkpoint.load=<out> checkpoint.load_model_only=true), its
               config.yaml, hf/ (the source's config.json and tokenizer files) and run.json
               (every file's size and CRC-32, checked before a load or an export)
export:
  checkpoint=  a run's checkpoints directory (its newest complete step) or one step directory;
               the model shape is read from the run's config.yaml; a file that differs from
               the step's run.json is named in one line, with the step to export instead
  out=         a new directory: config.json, model*.safetensors (+ index), tokenizer files of
               an imported model; loads with transformers' from_pretrained
  max_shard_size=  bytes per safetensors shard (default 5 GiB, as transformers)

Tensors keep their dtype both ways; import -> export gives byte-identical tensors. Conversion
runs in this one process on CPU (CUDA is hidden: Megatron's local layer spec names the weights).
The output is written to <out>.tmp-<pid> and renamed when complete. A mistake prints
`error: <one line>` and exits with code 2; the last line gives seconds and peak memory.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.entry.commands import CONVERT  # noqa: E402
from trainer.entry.contract import main  # noqa: E402

if __name__ == "__main__":  # dist_checkpointing's save starts a process that imports this file
    sys.exit(main(CONVERT))
