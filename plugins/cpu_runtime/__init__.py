"""CPU runtime plugin: runs unmodified Megatron Core over gloo when there is no CUDA device.

config.py (torch-free) holds its config and rules; runtime.py the named patches and their
activation; plugin.py the hooks; docs/cpu-runtime.md what each patch does and why.
"""
