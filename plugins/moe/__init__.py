"""Router figures of mixture-of-experts models, reported after every optimizer step.

config.py is torch-free: the plugin's switches. plugin.py counts the tokens each router sends to
each expert (a forward hook on Megatron Core's own router, attached through the layer spec) and
reads the load-balancing loss from Megatron Core's MoE metrics tracker; `after_step` reduces
both over the ranks and adds them to `StepMetrics.extra`. `docs/moe.md` says what each figure
means and how the expert-parallel layouts are tested.
"""
