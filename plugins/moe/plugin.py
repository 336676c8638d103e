"""Reports the router's figures at the log interval, global over all ranks.

Gathered only on the steps the log line shows (every `logging.log_interval` steps and the last):
between them nothing leaves the GPU, so the plugin adds no collective and no host
synchronisation to the steps in between; each figure covers the steps since the last log line
(the load-balancing loss their mean, tokens per expert their mean per step, the imbalance that
of their sum).

Load-balancing loss: Megatron Core's router records each layer's loss, per micro-batch, in its
MoE metrics tracker (`transformer/moe/router.py:596-603`, `transformer/moe/moe_logging.py:94`):
each TP x CP rank holds a partial value. `MoEMetricsTracker.report` (`moe_logging.py:130-212`)
sums it over PP and TP x CP, averages it over DP, scales it by 1 / micro-batches, takes the mean
over MoE layers and clears it for the next step: the figure Megatron-LM logs as
`load_balancing_loss`. This plugin calls that, so the figure is Megatron's own. The mean is over
the layers that routed tokens this step: `moe_layer_freq` counts MoE layers in a GPT model, but a
hybrid model places them by its pattern and leaves it at 1, which would divide by every layer
(Megatron-LM counts the pattern's `E` layers instead, `training/training.py:2771-2778`).

Tokens per expert: Megatron keeps no count (the router's `local_tokens_per_expert` exists only
with expert bias, `router.py:177-198`), so a forward hook on each router adds up its routing
map, the tokens x experts mask the router returns (`router.py:840-868`). The hook is attached
where the router is built: the layer spec's `MoESubmodules.router` (`moe_layer.py:152-157`)
becomes a builder that builds the same Megatron router and registers the hook, so no Megatron
layer is forked. Like Megatron's own counters (`router.py:728-739`) it counts only training
forwards with grad enabled: evaluation is left out, and a layer under full recompute counts once
(its first forward runs under no_grad, `tensor_parallel/random.py:606`). DP, CP and (with
sequence parallelism) TP ranks route different tokens and PP ranks different layers, so the sum
over the world is the global count; without sequence parallelism TP ranks route the same
tokens and only TP rank 0 counts them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.transformer.moe.moe_layer import MoESubmodules
from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

from plugins.protocol.events import RunStart, RuntimeContext, StepMetrics
from plugins.protocol.hooks import Plugin

# Tracker names of Megatron's load-balancing losses, by `moe_router_load_balancing_type`.
LOSS_NAMES = {
    "aux_loss": "load_balancing_loss",
    "seq_aux_loss": "seq_load_balancing_loss",
    "global_aux_loss": "global_load_balancing_loss",
}


def wrap_routers(node: Any, wrap: Callable[[Any], Any]) -> Any:
    """Copy of a layer/block spec tree with every `MoESubmodules.router` replaced by
    `wrap(router)`; walks dataclasses, lists and the `functools.partial` the MoE spec is
    (`models/gpt/moe_module_specs.py:87-89`). Nodes without routers are returned as they are."""
    if isinstance(node, MoESubmodules):
        wrapped = copy.copy(node)
        wrapped.router = wrap(node.router)
        return wrapped
    if isinstance(node, functools.partial):
        args = [wrap_routers(arg, wrap) for arg in node.args]
        keywords = {key: wrap_routers(value, wrap) for key, value in node.keywords.items()}
        return functools.partial(node.func, *args, **keywords)
    if isinstance(node, list):
        return [wrap_routers(item, wrap) for item in node]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        wrapped = copy.copy(node)
        for spec_field in dataclasses.fields(node):
            value = wrap_routers(getattr(node, spec_field.name), wrap)
            object.__setattr__(wrapped, spec_field.name, value)
        return wrapped
    return node


def tracked_loss_names(config: Any) -> list[str]:
    """Tracker names of the load-balancing losses this TransformerConfig turns on (the load
    balancing type and its coefficient may each be one value or a list, `router.py:385-398`)."""
    types = config.moe_router_load_balancing_type
    types = types if isinstance(types, list) else [types]
    coeffs = config.moe_aux_loss_coeff
    coeffs = coeffs if isinstance(coeffs, list) else [coeffs] * len(types)
    return [LOSS_NAMES[t] for t, c in zip(types, coeffs, strict=True) if t in LOSS_NAMES and c]


def table_rows(config: Any) -> int:
    """Rows of the per-layer tables: every decoder layer, then one per MTP layer position, as
    Megatron's MoE tracker sizes them (`transformer/moe/router.py:587-603`)."""
    return config.num_layers + (config.mtp_num_layers or 0)


def row_of(router: Any, config: Any) -> int:
    """A router's row: its layer; an MTP depth's router after the decoder's layers, by its
    place in the depth (Megatron's MTP layers number themselves from 1,
    `transformer/multi_token_prediction.py:1018-1031`; depths sharing weights share rows)."""
    offset = config.num_layers if getattr(router, "is_mtp_layer", False) else 0
    return offset + router.layer_number - 1


class RoutedTokenCounter:
    """Tokens each expert received this step, per layer, from this rank's routers."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None  # [layers, experts], float64

    def router_builder(self, build_router: Callable[..., Any], config: Any) -> Callable:
        """A router builder: Megatron's router as `build_router` makes it, hook registered."""

        def build(*args: Any, **kwargs: Any) -> Any:
            router = build_router(*args, **kwargs)
            router.register_forward_hook(functools.partial(self._count, config))
            return router

        return build

    def _count(self, config: Any, router: Any, inputs: Any, outputs: Any) -> None:
        if not (router.training and torch.is_grad_enabled()):
            return
        routing_map = outputs[1]  # bool [tokens, experts]
        if self.counts is None:
            shape = (table_rows(config), routing_map.shape[-1])
            self.counts = torch.zeros(shape, dtype=torch.float64, device=routing_map.device)
        with torch.no_grad():
            self.counts[row_of(router, config)] += routing_map.sum(dim=0)

    def global_counts(self, config: Any, device: Any) -> torch.Tensor:
        """[layers, experts] tokens of the global batches since the last call (a collective over
        the world; rows of layers without a router are zero); this rank's counts start again
        from zero.
        `device` serves ranks without routers."""
        local = self.counts
        if local is None:
            local = torch.zeros(table_rows(config), config.num_moe_experts, dtype=torch.float64,
                                device=device)
        duplicates = not config.sequence_parallel and (
            parallel_state.get_tensor_model_parallel_rank() > 0)
        total = torch.zeros_like(local) if duplicates else local.clone()
        torch.distributed.all_reduce(total)
        local.zero_()
        return total


def router_figures(per_layer: torch.Tensor, per_expert: bool) -> dict[str, float]:
    """Imbalance (max / mean tokens per expert; the worst MoE layer) and, with `per_expert`,
    each expert's tokens (mean over MoE layers, so they sum to tokens x top-k)."""
    imbalance = per_layer.max(dim=1).values / per_layer.mean(dim=1)
    figures = {"moe_imbalance": float(imbalance.max())}
    if per_expert:
        for expert, tokens in enumerate(per_layer.mean(dim=0).tolist()):
            figures[f"moe_tokens_e{expert}"] = tokens
    return figures


class MoePlugin(Plugin):
    def __init__(self, config: Any) -> None:  # the plugin's MoeConfig
        self.config = config
        self.model_config: Any = None  # Megatron's TransformerConfig, when the model has experts
        self.microbatches = 1  # per DP rank and step; set at run start
        self.log_interval = 1  # figures are gathered on logged steps only (and the last)
        self.last_step = 0
        self.steps = 0  # steps counted since the figures were last gathered
        self.counter = RoutedTokenCounter()
        self.runtime = RuntimeContext()  # the run's, once `setup_runtime` has seen it
        self.last_per_layer: list[list[float]] = []  # the last step's [MoE layer][expert] tokens

    def setup_runtime(self, runtime: RuntimeContext) -> None:
        self.runtime = runtime  # shared: later plugins may still choose the device

    def _device(self) -> torch.device:
        if self.runtime.device == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.runtime.device)

    def layer_spec(self, spec: Any, config: Any) -> Any:
        if not config.num_moe_experts:
            return spec
        self.model_config = config
        return wrap_routers(spec, lambda router: self.counter.router_builder(router, config))

    def run_start(self, start: RunStart) -> None:
        self.microbatches = start.config.layout.microbatches
        self.log_interval = max(1, start.config.logging.log_interval)
        self.last_step = start.total_steps
        self.steps = 0

    def _load_balancing_losses(self, moe_layers: list[int]) -> dict[str, float]:
        """Megatron's reduced load-balancing losses (a collective), empty when it has none,
        averaged over the steps its tracker summed since the last call;
        `moe_layers` marks the layers with a router (1) among all (Megatron's binary
        `moe_layer_freq`), so the mean is over MoE layers in a hybrid model too."""
        names = tracked_loss_names(self.model_config)
        if not names:
            return {}
        config, reduced = self.model_config, {}
        get_moe_metrics_tracker().report(
            loss_scale=1 / (self.microbatches * max(1, self.steps)), iteration=0,
            track_names=names,
            num_layers=config.num_layers, moe_layer_freq=moe_layers,
            mtp_num_layers=config.mtp_num_layers, force_initialize=True,
            total_loss_dict=reduced,
        )
        return {"moe_" + name: float(reduced[name]) for name in names}

    def _due(self, step: int) -> bool:
        """The steps the log line shows (`trainer/metrics.py` RunReporter.step)."""
        return step % self.log_interval == 0 or step == self.last_step

    def after_step(self, metrics: StepMetrics) -> None:
        if self.model_config is None:
            return
        self.steps += 1
        if not self._due(metrics.step):
            return  # the counts and Megatron's tracker keep adding up on the device
        counts = self.counter.global_counts(self.model_config, self._device()) / self.steps
        routed = counts.sum(dim=1) > 0  # every MoE layer routes each training token
        per_layer = counts[routed]
        self.last_per_layer = per_layer.tolist()
        # Megatron adds the MTP layers to the mean itself (`mtp_num_layers`): decoder rows only.
        decoder = routed.tolist()[:self.model_config.num_layers]
        metrics.extra.update(self._load_balancing_losses([int(r) for r in decoder]))
        metrics.extra.update(router_figures(per_layer, self.config.per_expert))
        self.steps = 0
