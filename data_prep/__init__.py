"""Corpus reading, tokenization and (later) Megatron indexed datasets and sequence packing."""
