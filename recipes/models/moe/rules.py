"""The MoE family's rules: expert parallelism, routing and the settings an expert layer needs.

One pure rule each, in the form of `recipes/config/validation.py`: EP needs experts and divides
them, the experts' own grid divides the world, top-k within the experts, no linear biases (an
in-place-on-view error in Megatron's expert MLP), expert bias with sigmoid scores, SP with TP
(Megatron's MoE layer raises otherwise), no router setting on a dense model, and a latent width
below the model's.

A latent MoE (`model.moe_latent_size`) needs no tensor-parallel rule: its two projections are
whole on every TP rank (Transformer Engine's "duplicated" linears, `transformer/moe/
moe_layer.py:264-289`, their gradients summed over TP under sequence parallelism) and the
experts split their FFN width, not the latent one (`transformer/moe/experts.py:215-245`).
"""

from __future__ import annotations

from typing import Any


def check_expert_parallel(cfg: Any) -> str | None:
    """EP splits the experts of each MoE layer; it needs experts and must divide them."""
    m, ep = cfg.model, cfg.parallel.expert
    if m.num_moe_experts is None:
        if ep > 1 or cfg.parallel.expert_tensor not in (None, cfg.parallel.tensor):
            return (
                f"parallel.expert={ep} / expert_tensor need an MoE model; set "
                "model.num_moe_experts or parallel.expert=1 and parallel.expert_tensor=null"
            )
        return
    if m.num_moe_experts % ep:
        return (
            f"model.num_moe_experts={m.num_moe_experts} is not divisible by parallel.expert={ep}; "
            "choose an expert parallel size that divides the expert count"
        )


def check_expert_world_size(cfg: Any) -> str | None:
    """Experts use their own grid: world = PP x expert-TP x EP x expert-DP."""
    if cfg.model.num_moe_experts is None:
        return
    p, layout = cfg.parallel, cfg.layout
    world, expert_grid = layout.world_size, layout.expert_model_parallel
    if world % expert_grid:
        return (
            f"world size {world} is not divisible by PP{p.pipeline} x expert-TP"
            f"{layout.expert_tensor_size} x EP{p.expert} = {expert_grid}; lower parallel.expert "
            "or parallel.expert_tensor, or change the cluster size"
        )


def check_router_topk(cfg: Any) -> str | None:
    m = cfg.model
    if m.num_moe_experts is not None and m.moe_router_topk > m.num_moe_experts:
        return (
            f"model.moe_router_topk={m.moe_router_topk} exceeds model.num_moe_experts="
            f"{m.num_moe_experts}; route each token to at most that many experts"
        )


def check_moe_bias(cfg: Any) -> str | None:
    """The Megatron Core local MoE spec fails in-place-on-view with linear biases."""
    if cfg.model.num_moe_experts is not None and cfg.model.add_bias_linear:
        return (
            "MoE models cannot use linear biases with the Megatron Core local layer spec "
            "(in-place-on-view error in the expert MLP); set model.add_bias_linear=false"
        )


def check_expert_bias(cfg: Any) -> str | None:
    """Aux-loss-free balancing adds its bias to sigmoid scores only (Megatron raises otherwise,
    `transformer/transformer_config.py:2284-2292`)."""
    m = cfg.model
    if m.moe_router_expert_bias and m.moe_router_score_function != "sigmoid":
        return ("model.moe_router_expert_bias=true needs model.moe_router_score_function=sigmoid "
                f"(got {m.moe_router_score_function}); set it, or moe_router_expert_bias=false")
    return None


def check_single_expert_softmax(cfg: Any) -> str | None:
    """A softmax over one selected score is 1 with zero gradient, so Megatron takes top-1
    softmax routing only with the softmax before the top-k (`moe_router_pre_softmax`, which
    this project does not set: `transformer/transformer_config.py:2328-2336`)."""
    m = cfg.model
    if m.num_moe_experts and m.moe_router_topk == 1 and m.moe_router_score_function == "softmax":
        return ("model.moe_router_topk=1 with model.moe_router_score_function=softmax gives the "
                "router no gradient (Megatron refuses it without a pre-top-k softmax); set "
                "model.moe_router_topk=2 or more, or moe_router_score_function=sigmoid")
    return None


def check_router_scaling(cfg: Any) -> str | None:
    """The top-k weights are multiplied by the scaling factor: it must be positive."""
    factor = cfg.model.moe_router_topk_scaling_factor
    if factor is not None and factor <= 0:
        return (f"model.moe_router_topk_scaling_factor={factor:g} must be positive; set it, "
                "e.g. 2.5, or null for no scaling")
    return None


def check_moe_settings_need_experts(cfg: Any) -> str | None:
    """Router and shared-expert settings on a dense model would be silently ignored."""
    m = cfg.model
    if m.num_moe_experts is not None:
        return None
    for key, value, default in (
        ("moe_router_expert_bias", m.moe_router_expert_bias, False),
        ("moe_router_score_function", m.moe_router_score_function, "softmax"),
        ("moe_router_topk_scaling_factor", m.moe_router_topk_scaling_factor, None),
        ("moe_shared_expert_ffn_hidden_size", m.moe_shared_expert_ffn_hidden_size, None),
        ("moe_load_balancing", m.moe_load_balancing, "aux_loss"),
        ("moe_latent_size", m.moe_latent_size, None),
    ):
        if value != default:
            return (f"model.{key}={value} needs an MoE model; set model.num_moe_experts or "
                    f"leave model.{key} at its default")
    return None


def check_moe_latent_size(cfg: Any) -> str | None:
    """A latent space as wide as the model saves nothing and adds two projections per MoE layer
    (Megatron builds any width, `transformer/moe/moe_layer.py:264-289`)."""
    m = cfg.model
    latent = m.moe_latent_size
    if latent is None or m.num_moe_experts is None or latent < m.hidden_size:
        return None
    return (f"model.moe_latent_size={latent} is not below model.hidden_size={m.hidden_size}: "
            "the experts would work as wide as the model, behind two extra projections; set "
            "it below hidden_size (Nemotron 3 Super: 1024 of 4096) or null")


def check_moe_tensor_parallel(cfg: Any) -> str | None:
    """Megatron Core's MoE layer refuses to train with TP > 1 unless SP is on."""
    p = cfg.parallel
    if cfg.model.num_moe_experts is not None and p.tensor > 1 and not p.sequence_parallel:
        return (
            f"MoE with parallel.tensor={p.tensor} needs sequence parallel (Megatron Core raises "
            "in the first forward otherwise); set parallel.sequence_parallel=true"
        )


RULES = (
    check_expert_parallel,
    check_expert_world_size,
    check_router_topk,
    check_moe_bias,
    check_expert_bias,
    check_single_expert_softmax,
    check_router_scaling,
    check_moe_settings_need_experts,
    check_moe_latent_size,
    check_moe_tensor_parallel,
)
