"""Offline data: tokenizing local files into Megatron indexed datasets, exact sequence packing
and its index, and the built-in corpora (the Python standard library, synthetic text)."""
