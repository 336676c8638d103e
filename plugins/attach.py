"""Turn a run's plugin configs into trainer hooks (one explicit list, no discovery)."""

from __future__ import annotations

from recipes.schema import RunConfig
from trainer.hooks import TrainerHooks


def attach_plugins(cfg: RunConfig, *, cpu_runtime_active: bool) -> TrainerHooks:
    hooks = TrainerHooks()
    if cpu_runtime_active:
        from plugins.cpu_runtime import adapt_local_layer_spec

        # Local-spec norms cannot run sequence parallel on CPU; the plugin swaps them.
        hooks.layer_spec.append(lambda cfg, spec, tc: adapt_local_layer_spec(spec, tc))
    return hooks
