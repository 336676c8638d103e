"""The planner: what a layout costs before a GPU-hour is spent.

Torch-free arithmetic over a resolved `RunConfig`, its `Layout` and a cluster description:
parameters each rank holds (`params`), model-state bytes by precision and sharding (`memory`),
activations and micro-batches in flight (`activations`, `schedule`), where ranks sit
(`placement`), what each rank sends per step (`comm`), the batch (`batch`), and whether it fits
with suggestions when it does not (`fit`). `report` turns a plan into text or JSON;
`command` is `scripts/plan.py`. The arithmetic is checked against the real Megatron Core model
built on the meta device and against Megatron-LM's own estimator (docs/planner.md).
"""
