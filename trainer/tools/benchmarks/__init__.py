"""The benchmarks behind `scripts/bench_*.py`: each prints its figures as ratios against a
reference measured in the same run (docs/benchmarks.md)."""
