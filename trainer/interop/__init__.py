"""Hugging Face interop: published `safetensors` models in, trained checkpoints out.

Why a package of its own: continued pretraining starts from a published Llama or Mixtral, and
evaluation and serving read Hugging Face's format, while the trainer reads and writes Megatron
distributed checkpoints (`torch_dist`, global keys, any layout). One concern per module:

- `hf_config`: a Hugging Face `config.json` <-> our `ModelConfig` (what is mapped, what is
  refused, the field-by-field comparison with a recipe); no torch.
- `mapping`: tensor names and layouts, Hugging Face <-> Megatron Core (QKV interleaved per query
  group, fused gate/up, vocabulary padding); pure tensor functions.
- `hf_files`: reading a Hugging Face model directory shard by shard and writing one atomically.
- `megatron_side`: the one-process Megatron context (`trainer.one_rank`), the template of the
  model's sharded state dict built on the meta device, and the torch_dist save/load through it.
- `importer` / `exporter`: the two directions, streamed (`docs/hf-interop.md`).
"""
