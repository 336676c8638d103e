"""The hybrid (NemotronH) family, torch-free: the layer pattern and its stage split
(`pattern.py`), its rules (`rules.py`), the Mamba2 layer's parameter and FLOPs terms
(`params.py`, `flops.py`). Built by `trainer/models/hybrid/`."""
