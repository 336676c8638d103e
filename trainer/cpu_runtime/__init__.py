"""The CPU runtime: unmodified Megatron Core over gloo on ranks without a CUDA device.

A backend of the trainer, not an optional feature: whether ranks run on CPU is `cluster.device`
(`auto`: on CPU exactly when there is no CUDA device). `runtime.py` holds the named patches
(`PATCH_NAMES`), their activation and the layer-spec adaptation; `cuda_api.py`,
`device_mode.py` and `collectives.py` the patches themselves; `norm.py`, `packed_attention.py`
and `cp_attention.py` the CPU stand-ins for what Transformer Engine does on GPUs; the Mamba
kernels in torch are the hybrid family's (`trainer/models/hybrid/cpu_kernels/`), installed by
`mamba_kernels.py`. `docs/cpu-runtime.md` says what each patch does and why.
"""
