"""Hugging Face interop: published `safetensors` models in, trained checkpoints out.

Why a package of its own: continued pretraining starts from a published Llama, Mixtral or
NemotronH model, and evaluation and serving read Hugging Face's format, while the trainer reads
and writes Megatron distributed checkpoints (`torch_dist`, global keys, any layout). What maps
to what is each model family's (`trainer/models/<family>/hf_config.py` and `hf_tensors.py`);
this package runs the conversion. One concern per module:

- `hf_config`: which family's `config.json` mapping a model goes through; no torch.
- `mapping`: which family's tensor mapping, and the sizes it needs.
- `hf_files`: reading a Hugging Face model directory shard by shard and writing one atomically.
- `megatron_side`: the one-process Megatron context (`trainer.one_rank`), the template of the
  model's sharded state dict built on the meta device, and the torch_dist save/load through it.
- `importer` / `exporter`: the two directions, streamed (`docs/hf-interop.md`).
- `import_manifest`: the `run.json` an import writes, so the damage check covers it.
- `export_step`: the step an export reads, checked against its `run.json` as pretrain.py checks
  it (no torch).
"""
