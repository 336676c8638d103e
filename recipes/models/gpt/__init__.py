"""The GPT family, torch-free: attention and MLP shape rules (`rules.py`), parameter terms
(`params.py`), FLOPs terms (`flops.py`). Built by `trainer/models/gpt/`."""
