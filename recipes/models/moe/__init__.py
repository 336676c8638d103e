"""The MoE family, torch-free: expert-parallel and routing rules (`rules.py`), the MoE layer's
parameter and FLOPs terms (`params.py`, `flops.py`). Its layers are Megatron Core's MoE layer,
built by the GPT and hybrid specs from `model.num_moe_experts`; its Hugging Face names are
Mixtral's (`trainer/models/gpt/`) and NemotronH's (`trainer/models/hybrid/`)."""
