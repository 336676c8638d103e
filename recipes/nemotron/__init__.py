"""The Nemotron family: Nemotron-4 (`nemotron4.py`), the hybrid Mamba-Transformer models
Nemotron-H, Nano v2 and Nemotron 3 Nano with the tiny hybrids (`nemotron_h.py`), Nemotron 3
Super (`nemotron3_super.py`); the sources they cite (`citations.py`) and `docs/nemotron.md`,
written from their tables (`page.py`)."""
