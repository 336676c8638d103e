"""Model families, the half that builds: per family its layer spec and model class
(`build.py`), its Hugging Face config and tensor mapping (`hf_config.py`, `hf_tensors.py`),
and the kernels its layers need on CPU.

- `gpt/`: Megatron Core's GPT decoder block and `GPTModel`; Llama and Mixtral on the Hugging
  Face side, and the rule type and conversions every family's tensor mapping uses.
- `hybrid/`: the hybrid stack spec (Megatron's on GPUs, local layers on CPU) and `HybridModel`;
  NemotronH on the Hugging Face side; the Mamba2 kernels in torch for CPU ranks.

`trainer/model.py` puts a family's chunks together the same way for every family. The
torch-free half (rules, parameter and FLOPs terms) is `recipes/models/<family>/`.
"""
