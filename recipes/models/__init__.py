"""Model families, the torch-free half: one folder per family with its shape rules and its
parameter and FLOPs terms.

- `gpt/`: attention + MLP decoders (Llama 3, Nemotron-4); its attention, MLP, embedding and
  output-layer terms serve every family.
- `moe/`: mixture-of-experts MLP layers (Mixtral; the `E` layers of hybrids).
- `hybrid/`: Mamba2 + attention + MLP/MoE by a layer pattern (Nemotron-H, Nano v2, Nemotron 3).

`kinds.py` names the layer kinds every term is counted in; `counts.py` the parameter-count
type. The configuration machinery composes the rules (`recipes/config/validation.py`), the
planner sums the terms (`recipes/plan/params.py`, `flops.py`). The half that builds a family
(layer spec, model class, Hugging Face mapping, CPU kernels) is `trainer/models/<family>/`;
its recipes are the catalogue's (`recipes/llama3.py`, `mixtral.py`, `nemotron/nemotron_h.py`, ...).
"""
