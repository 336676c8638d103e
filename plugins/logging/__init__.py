"""Run logging beyond metrics.jsonl: TensorBoard event files, Weights & Biases, a loss curve.

config.py is torch-free: which loggers are on. plugin.py hears the trainer's hooks on rank 0
only (every figure it logs is already reduced over the world) and hands the same scalars that
`metrics.jsonl` records to each writer (writers.py); at the end it draws the run's loss curve
(curves.py, shared with `scripts/compare_runs.py`). `docs/logging.md` says what is written
where.
"""
