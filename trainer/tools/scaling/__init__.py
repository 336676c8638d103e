"""The scaling harness behind `scripts/scaling.py`: the sweep over world sizes (`sweep.py`) and
the report and diagnosis read from each run's files (`report.py`)."""
