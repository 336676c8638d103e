"""A window of training steps under torch.profiler, written as a Chrome/Perfetto trace.

config.py is torch-free: whether and which steps are profiled. plugin.py starts the profiler
after the step before the window and stops it after the window's last step, through the
`after_step` hook; the trainer labels each step's data wait, forward-backward and optimizer with
`torch.profiler.record_function` (`trainer/step.py`). `docs/logging.md` says how to read it.
"""
