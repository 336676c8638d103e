"""The GPU fast paths a run turns on, and the rules Megatron Core and Transformer Engine assert
about them at run time, checked here before any rank starts.

The fast paths are typed fields of the model, parallel and train sections (the flex MoE
dispatcher, grouped GEMM, permute and router fusion, the shared-expert overlap, the fused
weighted squared ReLU, CUDA graphs, TP and EP communication overlap, selective recompute by
module, activation offloading); `trainer/mcore_translation.py` hands them to Megatron. Each
needs Transformer Engine's layers (or CUDA kernels) on GPU ranks: CPU ranks run without them
and `off_on_cpu` names what is left off there (the plan and the pre-flight print it). Every
rule is a pure function returning None or one line; each is Megatron's (the file:line it
asserts at) or says why a setting would silently do nothing. No torch here.
"""

from __future__ import annotations

from typing import Any

from recipes.config.schema import uses_transformer_engine
from recipes.models import kinds
from recipes.models.hybrid.pattern import layer_symbols

# Selective recompute's modules this project offers and prices (recipes/plan/activations.py);
# Megatron's other three need MLA, GatedDeltaNet or a priced shared expert
# (transformer/transformer_config.py:546-566).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act")
# Activation offloading's modules (transformer_config.py:1234-1247, less fused_group_mlp, which
# needs TE's operation fuser).
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                   "expert_fc1", "moe_act")
# What of a layer a CUDA graph captures (transformer_config.py:1047-1062).
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
_KIND_NAMES = {kinds.ATTENTION: "attention", kinds.MLP: "dense MLP", kinds.MOE: "MoE",
               kinds.MAMBA: "Mamba"}
MOE_FAST_PATHS = ("moe_grouped_gemm", "moe_permute_fusion", "moe_router_fusion",
                  "moe_shared_expert_overlap", "moe_fused_squared_relu")


def _symbols(cfg: Any) -> set[str]:
    """The layer kinds of the model: a GPT layer is attention and an MLP or MoE."""
    m = cfg.model
    if m.is_hybrid:
        return set(layer_symbols(m.hybrid_layer_pattern))
    return {kinds.ATTENTION, kinds.MOE if m.num_moe_experts else kinds.MLP}


def has_moe_layers(cfg: Any) -> bool:
    """Whether the model has MoE layers (a hybrid pattern's `E`, or a GPT model's experts)."""
    return kinds.MOE in _symbols(cfg)


def _on_local_layers(cfg: Any) -> bool:
    return cfg.model.transformer_impl == "local"


# ---- MoE -------------------------------------------------------------------------------------

def check_moe_fast_paths_need_experts(cfg: Any) -> str | None:
    """An MoE fast path on a dense model would silently do nothing."""
    m = cfg.model
    if m.num_moe_experts:
        return None
    for name in MOE_FAST_PATHS:
        if getattr(m, name):
            return (f"model.{name}=true needs an MoE model, but model.num_moe_experts is not set; "
                    f"set model.{name}=false")
    if m.moe_token_dispatcher == "flex":
        return ("model.moe_token_dispatcher=flex needs an MoE model, but model.num_moe_experts "
                "is not set; leave model.moe_token_dispatcher=alltoall")
    return None


def check_flex_backend_needs_flex(cfg: Any) -> str | None:
    """The flex dispatcher's backend is read only by the flex dispatcher."""
    m = cfg.model
    if m.moe_flex_backend == "deepep" or m.moe_token_dispatcher == "flex":
        return None
    return (f"model.moe_flex_backend={m.moe_flex_backend} is read only by the flex dispatcher, but "
            f"model.moe_token_dispatcher={m.moe_token_dispatcher}; set "
            "model.moe_token_dispatcher=flex or leave model.moe_flex_backend=deepep")


def check_flex_needs_expert_ranks(cfg: Any) -> str | None:
    """DeepEP exchanges tokens between expert ranks: Megatron asserts expert-TP x EP > 1 for it
    (transformer/moe/token_dispatcher.py:1770); HybridEP's manager has no such assert
    (:1779-1786) and is taken on one expert rank."""
    m, layout = cfg.model, cfg.layout
    if m.moe_token_dispatcher != "flex" or not m.num_moe_experts:
        return None
    if m.moe_flex_backend != "deepep" or layout.expert_tensor_size * layout.expert > 1:
        return None
    return ("model.moe_token_dispatcher=flex with model.moe_flex_backend=deepep exchanges "
            "tokens between expert ranks, but parallel.expert=1 and expert-TP 1 (Megatron "
            "asserts TPxEP > 1); set parallel.expert above 1, model.moe_flex_backend=hybridep "
            "or model.moe_token_dispatcher=alltoall")


def check_flex_on_gpus(cfg: Any) -> str | None:
    """DeepEP and HybridEP are CUDA kernels under Transformer Engine's layers."""
    if cfg.model.moe_token_dispatcher != "flex" or not _on_local_layers(cfg):
        return None
    return ("model.moe_token_dispatcher=flex needs Transformer Engine's layers (DeepEP/HybridEP "
            "kernels), but model.transformer_impl=local; set model.transformer_impl=auto or "
            "model.moe_token_dispatcher=alltoall")


def check_moe_kernels_need_transformer_engine(cfg: Any) -> str | None:
    """Grouped GEMM, permute and router fusion are Transformer Engine kernels (TEGroupedMLP;
    transformer/moe/moe_utils.py fused_permute, fused_topk_with_score_function): with the local
    layers Megatron raises (transformer_config.py:2651-2667) or builds its legacy GroupedMLP."""
    if not _on_local_layers(cfg):
        return None
    for name in ("moe_grouped_gemm", "moe_permute_fusion", "moe_router_fusion"):
        if getattr(cfg.model, name):
            return (f"model.{name}=true is a Transformer Engine kernel, but "
                    f"model.transformer_impl=local; set model.transformer_impl=auto or "
                    f"model.{name}=false")
    return None


def check_hybrid_experts_are_grouped(cfg: Any) -> str | None:
    """Megatron's hybrid stack spec builds Transformer Engine's grouped-GEMM experts whatever the
    config says (`models/hybrid/hybrid_layer_specs.py:62`): a hybrid MoE model on TE layers says
    so, or its moe_act recompute and FP8 checks would read a config unlike the model."""
    m = cfg.model
    if not (m.is_hybrid and m.num_moe_experts) or m.moe_grouped_gemm or _on_local_layers(cfg):
        return None
    return ("model.moe_grouped_gemm=false, but Megatron's hybrid layers on Transformer Engine "
            "always build grouped-GEMM experts; set model.moe_grouped_gemm=true (CPU ranks run "
            "without it)")


def check_shared_expert_overlap(cfg: Any) -> str | None:
    """The shared experts overlap the token exchange only when there are shared experts, with
    the alltoall or flex dispatcher (transformer_config.py:1644-1650)."""
    m = cfg.model
    if not m.moe_shared_expert_overlap or not m.num_moe_experts:
        return None
    if m.moe_shared_expert_ffn_hidden_size is None:
        return ("model.moe_shared_expert_overlap=true needs shared experts, but "
                "model.moe_shared_expert_ffn_hidden_size is not set; set "
                "model.moe_shared_expert_overlap=false")
    if m.moe_token_dispatcher == "allgather":
        return ("model.moe_shared_expert_overlap=true works with the alltoall or flex dispatcher "
                "only (Megatron raises), but model.moe_token_dispatcher=allgather; set "
                "model.moe_token_dispatcher=alltoall or model.moe_shared_expert_overlap=false")
    return None


def check_fused_squared_relu(cfg: Any) -> str | None:
    """The fused weighted squared ReLU runs inside the grouped-GEMM experts for squared ReLU
    without biases (transformer/moe/experts.py:370-375, 849-856); otherwise it does nothing."""
    m = cfg.model
    if not m.moe_fused_squared_relu or not m.num_moe_experts:
        return None
    if m.activation != "squared_relu":
        return (f"model.moe_fused_squared_relu=true fuses squared ReLU, but model.activation="
                f"{m.activation}; set model.moe_fused_squared_relu=false")
    if not m.moe_grouped_gemm:
        return ("model.moe_fused_squared_relu=true runs inside the grouped-GEMM experts, but "
                "model.moe_grouped_gemm=false; set model.moe_grouped_gemm=true or "
                "model.moe_fused_squared_relu=false")
    return None


# ---- recompute and offloading ----------------------------------------------------------------

def _unknown(values: list[str], allowed: tuple[str, ...], key: str) -> str | None:
    for value in values:
        if value not in allowed:
            return (f"{key} has '{value}', not one of {', '.join(allowed)}; remove it "
                    f"(e.g. {key}=[{allowed[0]}])")
    if len(set(values)) != len(values):
        return f"{key}={values} names a module twice; name each once"
    return None


def check_recompute_modules_known(cfg: Any) -> str | None:
    """Megatron asserts the names (transformer_config.py:1766-1782); an empty list would
    recompute nothing while saying selective."""
    t = cfg.train
    if not t.recompute_modules:
        return ("train.recompute_modules=[] recomputes nothing; name modules, e.g. "
                "train.recompute_modules=[core_attn], or set train.recompute=none")
    return _unknown(t.recompute_modules, RECOMPUTE_MODULES, "train.recompute_modules")


def check_recompute_modules_need_selective(cfg: Any) -> str | None:
    """The modules are selective recompute's; with none or full they would do nothing."""
    t = cfg.train
    if t.recompute == "selective" or t.recompute_modules == ["core_attn"]:
        return None
    return (f"train.recompute_modules={t.recompute_modules} is read only by selective recompute, "
            f"but train.recompute={t.recompute}; set train.recompute=selective or leave "
            "train.recompute_modules at [core_attn]")


def check_recompute_modules_match_layers(cfg: Any) -> str | None:
    """mlp recomputes dense MLPs, moe and moe_act the experts: on a model without them nothing
    would be recomputed (Megatron does not say)."""
    t, symbols = cfg.train, _symbols(cfg)
    if t.recompute != "selective":
        return None
    needs = {"mlp": kinds.MLP, "moe": kinds.MOE, "moe_act": kinds.MOE,
             "core_attn": kinds.ATTENTION, "layernorm": None}
    for module in t.recompute_modules:
        kind = needs.get(module)
        if kind is not None and kind not in symbols:
            return (f"train.recompute_modules has {module}, but the model has no "
                    f"{_KIND_NAMES[kind]} layer to recompute; remove {module}")
    return None


def check_moe_act_recompute_needs_grouped_gemm(cfg: Any) -> str | None:
    """transformer_config.py:1784-1787."""
    t, m = cfg.train, cfg.model
    if t.recompute != "selective" or "moe_act" not in t.recompute_modules or m.moe_grouped_gemm:
        return None
    return ("train.recompute_modules has moe_act, which Megatron recomputes only in grouped-GEMM "
            "experts, but model.moe_grouped_gemm=false; set model.moe_grouped_gemm=true or "
            "remove moe_act")


def check_mlp_recompute_without_linear_biases(cfg: Any) -> str | None:
    """With biases a dense MLP returns its output bias unadded (`skip_bias_add`, mlp.py:251),
    the bias parameter itself, and Megatron's CheckpointFunction (tensor_parallel/random.py:
    581-660) returns it as its own output: autograd then gives the parameter the checkpoint's
    backward as its grad_fn, and that backward, recomputing, calls itself without end (a hang,
    measured on CPU ranks; plain torch ends in RecursionError)."""
    t = cfg.train
    if t.recompute != "selective" or "mlp" not in t.recompute_modules:
        return None
    if not cfg.model.add_bias_linear:
        return None
    return ("train.recompute_modules has mlp with model.add_bias_linear=true: Megatron's "
            "checkpoint returns the MLP's bias parameter as its output and its backward then "
            "re-enters itself without end; set model.add_bias_linear=false or remove mlp")


def check_offload_modules_known(cfg: Any) -> str | None:
    """transformer_config.py:1852-1867."""
    return _unknown(cfg.train.offload_modules, OFFLOAD_MODULES, "train.offload_modules")


def check_offload_attention_projection(cfg: Any) -> str | None:
    """attn_proj's input is core attention's output, which core attention's backward needs
    (transformer_config.py:1868-1873)."""
    modules = cfg.train.offload_modules
    if "attn_proj" not in modules or "core_attn" in modules:
        return None
    return ("train.offload_modules has attn_proj without core_attn (its input is core "
            "attention's output, which core attention's backward needs); add core_attn or "
            "remove attn_proj")


def check_offload_inside_recomputed_moe(cfg: Any) -> str | None:
    """Recomputing the whole MoE layer keeps nothing inside it to offload
    (transformer_config.py:1874-1885)."""
    t = cfg.train
    inside = [m for m in ("expert_fc1", "moe_act") if m in t.offload_modules]
    if not inside or t.recompute != "selective" or "moe" not in t.recompute_modules:
        return None
    return (f"train.offload_modules has {inside[0]} while train.recompute_modules has moe (the "
            f"whole MoE layer is recomputed, nothing inside it is kept); remove {inside[0]} or moe")


def check_offload_modules_match_layers(cfg: Any) -> str | None:
    """Expert inputs exist only in an MoE model, attention's only with attention layers."""
    symbols = _symbols(cfg)
    for module in cfg.train.offload_modules:
        if module in ("expert_fc1", "moe_act") and kinds.MOE not in symbols:
            return (f"train.offload_modules has {module}, but the model has no MoE layer; remove "
                    f"{module}")
        if module in ("attn_norm", "qkv_linear", "core_attn", "attn_proj") and (
                kinds.ATTENTION not in symbols):
            return (f"train.offload_modules has {module}, but the model has no attention layer; "
                    f"remove {module}")
    return None


def router_graph_keeps_norm(cfg: Any) -> bool:
    """Whether Megatron leaves an MoE layer's pre-MLP norm out of selective recompute because
    Transformer Engine's graph of the router returns the norm's output: the router graphed
    without `moe_preprocess`, or with it but neither the alltoall dispatcher nor a latent MoE,
    or beside the shared-expert overlap (`transformer/transformer_layer.py:458-505`)."""
    t, m = cfg.train, cfg.model
    if t.cuda_graphs != "transformer_engine" or "moe_router" not in t.cuda_graph_modules:
        return False
    if m.moe_shared_expert_ffn_hidden_size and m.moe_shared_expert_overlap:
        return True
    return not ("moe_preprocess" in t.cuda_graph_modules and (
        m.moe_latent_size or m.moe_token_dispatcher == "alltoall"))


def check_offload_fused_norms(cfg: Any) -> str | None:
    """Offloading runs on Transformer Engine's layers, whose QKV and dense FC1 linears hold
    their norms (`TELayerNormColumnParallelLinear`; `input_layernorm` and a dense layer's
    `pre_mlp_layernorm` are IdentityOp, models/gpt/gpt_layer_specs.py:138-157): `attn_norm`
    names no module there, nor `mlp_norm` without MoE layers, whose own norm Megatron does not
    offload under a graph of attention or of the router (transformer_layer.py:1442-1492)."""
    t = cfg.train
    if _on_local_layers(cfg):
        return None  # offloading itself is refused there
    if "attn_norm" in t.offload_modules:
        return ("train.offload_modules has attn_norm, but Transformer Engine's QKV linear holds "
                "the attention norm (Megatron offloads nothing for it); use qkv_linear, which "
                "moves the norm's input with its own, or remove attn_norm")
    if "mlp_norm" not in t.offload_modules:
        return None
    if not has_moe_layers(cfg):
        return ("train.offload_modules has mlp_norm, but Transformer Engine's FC1 holds a dense "
                "MLP's norm and the model has no MoE layer (Megatron offloads nothing for it); "
                "remove mlp_norm")
    graphed = t.cuda_graph_modules if t.cuda_graphs != "none" else []
    blocker = next((module for module in ("attn", "moe_router") if module in graphed), None)
    if blocker:
        return (f"train.offload_modules has mlp_norm, which Megatron does not offload in an MoE "
                f"layer while train.cuda_graph_modules has {blocker}; remove mlp_norm")
    return None


def check_layernorm_recompute_under_graphs(cfg: Any) -> str | None:
    """CUDA graphs run on Transformer Engine's layers (`check_cuda_graphs_need_transformer_
    engine`), where only an MoE layer's pre-MLP norm is a module to recompute (the others are
    fused into the next linear, `check_offload_fused_norms`), and Megatron leaves it alone
    inside a graph of the router but for alltoall or latent MoE with `moe_preprocess` graphed
    too (transformer_layer.py:450-505)."""
    t = cfg.train
    if (t.recompute != "selective" or "layernorm" not in t.recompute_modules
            or t.cuda_graphs == "none" or _on_local_layers(cfg)):
        return None
    if not has_moe_layers(cfg):
        return ("train.recompute_modules has layernorm, but with train.cuda_graphs="
                f"{t.cuda_graphs} the layers are Transformer Engine's, whose QKV and FC1 "
                "linears hold the norms, and the model has no MoE layer with a norm of its own "
                "(Megatron recomputes nothing); remove layernorm")
    if router_graph_keeps_norm(cfg):
        return ("train.recompute_modules has layernorm, which Megatron does not recompute in "
                "an MoE layer whose router is graphed (train.cuda_graph_modules has moe_router "
                "without moe_preprocess, or the alltoall dispatcher or a latent MoE, or with "
                "the shared-expert overlap); remove layernorm or moe_router")
    return None


def check_offload_needs_transformer_engine(cfg: Any) -> str | None:
    """Megatron-LM asserts Transformer Engine's layers (training/arguments.py:1854-1856)."""
    if not cfg.train.offload_modules or not _on_local_layers(cfg):
        return None
    return ("train.offload_modules needs Transformer Engine's layers (Megatron offloads their "
            "inputs), but model.transformer_impl=local; set model.transformer_impl=auto or "
            "train.offload_modules=[]")


# ---- CUDA graphs -------------------------------------------------------------------------------

def check_cuda_graph_modules_known(cfg: Any) -> str | None:
    """transformer_config.py:2408-2443."""
    return _unknown(cfg.train.cuda_graph_modules, CUDA_GRAPH_MODULES, "train.cuda_graph_modules")


def check_cuda_graph_modules_need_graphs(cfg: Any) -> str | None:
    t = cfg.train
    if t.cuda_graphs != "none" or not t.cuda_graph_modules:
        return None
    return (f"train.cuda_graph_modules={t.cuda_graph_modules} is read only with CUDA graphs, but "
            "train.cuda_graphs=none; set train.cuda_graphs=transformer_engine or "
            "train.cuda_graph_modules=[]")


def check_cuda_graph_module_pairs(cfg: Any) -> str | None:
    """moe and moe_router exclude each other; TE's graphs take moe_preprocess only with
    moe_router (transformer_config.py:2486-2494); Megatron's own graphs add each of the two to
    the other (:2472-2482), so there moe_preprocess is moe_router too."""
    graphed, impl = cfg.train.cuda_graph_modules, cfg.train.cuda_graphs
    if impl == "none":
        return None
    router = [x for x in ("moe_router", "moe_preprocess") if x in graphed
              and (x == "moe_router" or impl == "local")]
    if "moe" in graphed and router:
        return (f"train.cuda_graph_modules has both moe and {router[0]} (Megatron graphs the "
                "whole MoE layer or its router, not both); keep one")
    if "moe_preprocess" in graphed and not router:
        return ("train.cuda_graph_modules has moe_preprocess without moe_router (Transformer "
                "Engine's graphs take it only with the router); add moe_router")
    return None


def check_cuda_graph_modules_match_layers(cfg: Any) -> str | None:
    """A graphed module the model lacks: Megatron refuses moe scopes on a dense model and mlp on
    a model with experts (transformer_config.py:2495-2507: it reads `moe_layer_freq`, 1 here,
    so a hybrid pattern's dense MLP layers beside MoE ones do not count); attn or mamba without
    such layers would graph nothing. The whole MoE layer is graphed only with token dropping,
    which this project does not train (:2508-2513)."""
    t, symbols = cfg.train, _symbols(cfg)
    if t.cuda_graphs == "none":
        return None
    needs = {"attn": kinds.ATTENTION, "mlp": kinds.MLP, "moe_router": kinds.MOE,
             "moe_preprocess": kinds.MOE, "mamba": kinds.MAMBA}
    for module in t.cuda_graph_modules:
        if module == "moe" and "moe_router" not in t.cuda_graph_modules:  # else: the pair rule
            return ("train.cuda_graph_modules has moe, which Megatron graphs only for MoE with "
                    "token dropping and padding (not trained here); use moe_router")
        if module == "mlp" and cfg.model.num_moe_experts and kinds.MLP in symbols:
            return ("train.cuda_graph_modules has mlp, which Megatron 0.19.2 refuses in a model "
                    "with experts even beside its dense MLP layers (it takes every layer for "
                    "MoE); remove mlp, or graph the experts' router with moe_router")
        kind = needs.get(module)
        if kind is not None and kind not in symbols:
            return (f"train.cuda_graph_modules has {module}, but the model has no "
                    f"{_KIND_NAMES[kind]} layer; remove {module}")
    return None


def check_cuda_graphs_with_full_recompute(cfg: Any) -> str | None:
    """Per-layer graphs cannot replay a layer rebuilt by full recompute
    (transformer_config.py:2527-2531)."""
    t = cfg.train
    if t.cuda_graphs == "none" or t.recompute != "full":
        return None
    return (f"train.cuda_graphs={t.cuda_graphs} cannot be used with train.recompute=full (Megatron "
            "graphs a whole recomputed layer only in its full-iteration graph); set "
            "train.recompute=selective or train.cuda_graphs=none")


def _graphs_whole_layer(cfg: Any) -> bool:
    return cfg.train.cuda_graphs != "none" and not cfg.train.cuda_graph_modules


def check_cuda_graphs_with_recompute_modules(cfg: Any) -> str | None:
    """A recomputed module inside a graph cannot draw new random numbers, and TE's graphed
    router excludes recomputing the whole MoE layer (transformer_config.py:2533-2580)."""
    t, m = cfg.train, cfg.model
    if t.cuda_graphs == "none" or t.recompute != "selective":
        return None
    graphed, whole = t.cuda_graph_modules, _graphs_whole_layer(cfg)
    if t.cuda_graphs == "transformer_engine" and "moe" in t.recompute_modules and (
            "moe_router" in graphed):
        return ("train.recompute_modules has moe while train.cuda_graph_modules has moe_router "
                "(Transformer Engine's graph of the router is inside the recomputed layer); "
                "remove one")
    if m.attention_dropout and "core_attn" in t.recompute_modules and (whole or "attn" in graphed):
        return (f"model.attention_dropout={m.attention_dropout:g} cannot be recomputed inside a "
                "CUDA graph of attention; remove core_attn from train.recompute_modules, attn "
                "from train.cuda_graph_modules, or set model.attention_dropout=0")
    dropped = [x for x in ("mlp", "moe") if x in t.recompute_modules]
    if m.hidden_dropout and dropped and (whole or "mlp" in graphed):
        return (f"model.hidden_dropout={m.hidden_dropout:g} cannot be recomputed inside a CUDA "
                f"graph of the MLP; remove {dropped[0]} from train.recompute_modules or set "
                "model.hidden_dropout=0")
    return None


def check_cuda_graphs_with_offloading(cfg: Any) -> str | None:
    """Megatron's own graphs take only the experts' offloading, around a graph that does not
    hold the whole layer (transformer_config.py:2591-2626)."""
    t = cfg.train
    if t.cuda_graphs != "local" or not t.offload_modules:
        return None
    others = [x for x in t.offload_modules if x not in ("expert_fc1", "moe_act")]
    if others or not t.cuda_graph_modules:
        return ("train.cuda_graphs=local takes activation offloading of expert_fc1 and moe_act "
                "only, around graphs of part of a layer; use train.cuda_graphs=transformer_engine")
    return None


def check_te_graphs_with_packed_rows(cfg: Any) -> str | None:
    """Transformer Engine's graph of attention replays tensors only and asserts that no
    `packed_seq_params` reach it (transformer/transformer_layer.py:1225-1231); Mamba's asserts
    every argument is a tensor (transformer/module.py:306-310, via ssm/mamba_layer.py:199).
    Packed rows carry their documents' bounds as `packed_seq_params`: the first replay after
    the graphs' warm-up would stop the run."""
    t = cfg.train
    if t.cuda_graphs != "transformer_engine" or not cfg.data.packed_rows:
        return None
    graphed = [x for x in ("attn", "mamba") if x in t.cuda_graph_modules]
    if t.cuda_graph_modules and not graphed:
        return None
    what = ", ".join(graphed) if graphed else "whole layers"
    return (f"train.cuda_graphs=transformer_engine graphs {what}, whose replay takes no packed "
            f"rows' document bounds (Megatron asserts), but data.documents={cfg.data.documents}; "
            "set train.cuda_graphs=none, or graph other modules (train.cuda_graph_modules)")


def check_cuda_graphs_need_transformer_engine(cfg: Any) -> str | None:
    """TE's graphs are made by TE (transformer/cuda_graphs.py:2098); Megatron-LM turns TE's RNG
    tracker on for every graph (training/arguments.py:1873-1879), which the local layers lack."""
    if cfg.train.cuda_graphs == "none" or not _on_local_layers(cfg):
        return None
    return (f"train.cuda_graphs={cfg.train.cuda_graphs} needs Transformer Engine's layers, but "
            "model.transformer_impl=local; set model.transformer_impl=auto or "
            "train.cuda_graphs=none")


# ---- TP and EP communication overlap ---------------------------------------------------------

def check_tp_overlap_needs_sequence_parallel(cfg: Any) -> str | None:
    """Megatron-LM asserts it (training/arguments.py:1401-1402): userbuffers overlap the
    sequence-parallel all-gather and reduce-scatter."""
    p = cfg.parallel
    if not p.tp_comm_overlap or p.sequence_parallel:
        return None
    return ("parallel.tp_comm_overlap=true overlaps sequence parallel's all-gathers and "
            "reduce-scatters, but parallel.sequence_parallel=false; set "
            "parallel.sequence_parallel=true (with parallel.tensor > 1) or "
            "parallel.tp_comm_overlap=false")


def check_tp_overlap_needs_transformer_engine(cfg: Any) -> str | None:
    """The userbuffers are Transformer Engine's (training/initialize.py:190-200)."""
    if not cfg.parallel.tp_comm_overlap or not _on_local_layers(cfg):
        return None
    return ("parallel.tp_comm_overlap=true needs Transformer Engine's layers (its userbuffers), "
            "but model.transformer_impl=local; set model.transformer_impl=auto or "
            "parallel.tp_comm_overlap=false")


def check_ep_overlap(cfg: Any) -> str | None:
    """Megatron's EP overlap asserts (transformer_config.py:2668-2705): expert parallelism with
    the alltoall or flex dispatcher, VPP when PP > 1, no full recompute and no recomputed MoE,
    bf16 or fp16, without the shared-expert overlap; only GPTModel builds its 1F1B schedule plan
    (models/gpt/gpt_model.py:798)."""
    p, m, t = cfg.parallel, cfg.model, cfg.train
    if not p.ep_comm_overlap:
        return None
    fix = "or set parallel.ep_comm_overlap=false"
    if not m.num_moe_experts or p.expert < 2:
        return ("parallel.ep_comm_overlap=true needs expert parallelism; set parallel.expert > 1 "
                + fix)
    if m.is_hybrid:
        return ("parallel.ep_comm_overlap=true is built by Megatron's GPT model only, but "
                f"model.hybrid_layer_pattern is set; {fix.removeprefix('or ')}")
    if m.moe_token_dispatcher == "allgather":
        return ("parallel.ep_comm_overlap=true needs the alltoall or flex dispatcher; set "
                f"model.moe_token_dispatcher=alltoall {fix}")
    if p.pipeline > 1 and p.virtual_pipeline is None:
        return ("parallel.ep_comm_overlap=true with parallel.pipeline > 1 needs interleaving; set "
                f"parallel.virtual_pipeline {fix}")
    if t.recompute == "full" or (t.recompute == "selective" and "moe" in t.recompute_modules):
        return ("parallel.ep_comm_overlap=true cannot recompute the MoE layer (full recompute or "
                f"moe in train.recompute_modules); recompute less {fix}")
    if cfg.precision.dtype == "fp32":
        return f"parallel.ep_comm_overlap=true needs bf16 or fp16; set precision.dtype=bf16 {fix}"
    if m.moe_shared_expert_overlap:
        return ("parallel.ep_comm_overlap=true replaces model.moe_shared_expert_overlap; set "
                f"model.moe_shared_expert_overlap=false {fix}")
    if cfg.train.cuda_graphs == "transformer_engine" and (
            _graphs_whole_layer(cfg) or "mlp" in cfg.train.cuda_graph_modules):
        return ("parallel.ep_comm_overlap=true cannot run inside Transformer Engine's graph of the "
                "MLP or whole layer; graph attn or moe_router only (train.cuda_graph_modules) "
                f"{fix}")
    return None


def check_ep_overlap_with_fsdp_graphs(cfg: Any) -> str | None:
    """Megatron FSDP's wrapper asserts that EP overlap runs without per-layer CUDA graphs
    (distributed/fsdp/mcore_fsdp_adapter.py:173-178)."""
    p, t = cfg.parallel, cfg.train
    if not p.ep_comm_overlap or cfg.optimizer.fsdp == "none" or t.cuda_graphs == "none":
        return None
    return (f"parallel.ep_comm_overlap=true under Megatron FSDP (optimizer.fsdp="
            f"{cfg.optimizer.fsdp}) takes no per-layer CUDA graphs (train.cuda_graphs="
            f"{t.cuda_graphs}); set train.cuda_graphs=none, optimizer.fsdp=none or "
            "parallel.ep_comm_overlap=false")


RULES = (
    check_moe_fast_paths_need_experts, check_flex_backend_needs_flex,
    check_flex_needs_expert_ranks, check_flex_on_gpus, check_moe_kernels_need_transformer_engine,
    check_hybrid_experts_are_grouped, check_shared_expert_overlap, check_fused_squared_relu,
    check_recompute_modules_known, check_recompute_modules_need_selective,
    check_recompute_modules_match_layers, check_moe_act_recompute_needs_grouped_gemm,
    check_mlp_recompute_without_linear_biases,
    check_offload_modules_known, check_offload_attention_projection,
    check_offload_inside_recomputed_moe, check_offload_modules_match_layers,
    check_offload_needs_transformer_engine, check_offload_fused_norms,
    check_layernorm_recompute_under_graphs,
    check_cuda_graph_modules_known, check_cuda_graph_modules_need_graphs,
    check_cuda_graph_module_pairs, check_cuda_graph_modules_match_layers,
    check_cuda_graphs_with_full_recompute, check_cuda_graphs_with_recompute_modules,
    check_cuda_graphs_with_offloading, check_cuda_graphs_need_transformer_engine,
    check_te_graphs_with_packed_rows,
    check_tp_overlap_needs_sequence_parallel, check_tp_overlap_needs_transformer_engine,
    check_ep_overlap, check_ep_overlap_with_fsdp_graphs,
)


# ---- what is on, and what CPU ranks leave off --------------------------------------------------

def fast_paths_on(cfg: Any) -> list[str]:
    """The fast paths this config asks for, in the words the plan line prints."""
    m, p, t = cfg.model, cfg.parallel, cfg.train
    on = []
    if m.num_moe_experts and m.moe_token_dispatcher == "flex":
        on.append(f"flex dispatcher ({m.moe_flex_backend})")
    on += [name.removeprefix("moe_").replace("_", " ") for name in MOE_FAST_PATHS
           if m.num_moe_experts and getattr(m, name)]
    if t.cuda_graphs != "none":
        scope = ", ".join(t.cuda_graph_modules) or "whole layers"
        on.append(f"CUDA graphs ({t.cuda_graphs}: {scope})")
    if p.tp_comm_overlap:
        on.append("TP comm overlap")
    if p.ep_comm_overlap:
        on.append("EP comm overlap")
    if t.recompute == "selective":
        on.append(f"selective recompute ({', '.join(t.recompute_modules)})")
    if t.offload_modules:
        on.append(f"activation offloading ({', '.join(t.offload_modules)})")
    return on


def gpu_only_fast_paths(cfg: Any) -> list[str]:
    """What of `fast_paths_on` needs GPU ranks with Transformer Engine (selective recompute
    runs anywhere)."""
    return [name for name in fast_paths_on(cfg) if not name.startswith("selective recompute")]


def off_on_cpu(cfg: Any, on_gpu: bool) -> list[str]:
    """The GPU fast paths these ranks leave off: every one on CPU ranks, none on TE ranks."""
    if uses_transformer_engine(cfg.model.transformer_impl, on_gpu):
        return []
    return gpu_only_fast_paths(cfg)
