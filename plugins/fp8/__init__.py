"""FP8 training through Transformer Engine (GPU only); see config.py for why it is a plugin."""
