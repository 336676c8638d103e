"""The GPT family, building: `build.py` (block spec, `GPTModel`), `hf_config.py` and
`hf_tensors.py` (Llama and Mixtral)."""
