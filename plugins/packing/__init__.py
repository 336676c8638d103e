"""Exact sequence packing: several documents in one row, each attending only within itself.

One packed batch format serves CPU and GPU (`batch.py` builds it, `docs/packed-sequences.md` says
why each field is as it is). The plugin (`plugin.py`) turns a packed micro-batch's boundaries into
Megatron's THD `PackedSeqParams`; Transformer Engine consumes them on GPU, and the CPU runtime's
`PackedDotProductAttention` (`trainer/cpu_runtime/packed_attention.py`) on CPU. config.py is
torch-free: the plugin's switch and rules.
"""
