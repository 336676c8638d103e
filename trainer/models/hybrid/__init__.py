"""The hybrid family, building: `spec.py` (the stack spec), `build.py` (`HybridModel`),
`hf_config.py` and `hf_tensors.py` (NemotronH), `cpu_kernels/` (Mamba2 in torch for CPU ranks,
installed into Megatron's mixer by the CPU runtime)."""
