"""The GPU fast paths, pinned on CPU: with Transformer Engine's layers every recipe's
TransformerConfig has the fusions Megatron-LM and Bridge use (each off only for its reason);
with the local layers none; a GPU node without TE is refused before launch; the dry run builds
TE layers on the meta device."""

from __future__ import annotations

import dataclasses

import pytest
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.tensor_parallel import layers
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.moe import moe_utils

from plugins.protocol.errors import ConfigError
from recipes.config.machine import MachineInfo, check_machine
from recipes.config.overrides import apply_overrides
from recipes.plan.fit import local_attention_cost
from recipes.registry import RECIPES, get_recipe
from tests.one_rank_world import one_rank_world
from trainer.mcore_translation import FUSIONS, build_transformer_config, fusions_line


@pytest.fixture
def te_kernels(monkeypatch):
    """What TransformerConfig checks for on a GPU node with TE (and APEX's wgrad kernel); TE's
    version below 2.10 for the translation's own check (`_te_at_least`), whether or not TE is
    installed here (test_fsdp_wgrad_fusion_with_te_2_10 stages a newer one)."""
    import megatron.core.utils

    monkeypatch.setattr(megatron.core.utils, "is_te_min_version", lambda *args, **kw: False)
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *args: None)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    for name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                 "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
        monkeypatch.setattr(moe_utils, name, lambda *args: None)


@pytest.mark.parametrize("name", list(RECIPES))
def test_transformer_engine_layers_get_every_fusion_that_applies(name, te_kernels):
    cfg = get_recipe(name)
    config = build_transformer_config(cfg, cpu_initialization=False, transformer_engine=True)
    m = cfg.model
    assert config.bias_activation_fusion == (m.activation == "swiglu" or (
        m.activation == "gelu" and m.add_bias_linear))  # no kernel for squared ReLU
    assert config.apply_rope_fusion == (m.position_embedding == "rope")
    assert config.bias_dropout_fusion and config.masked_softmax_fusion
    # Megatron FSDP fuses the weight-gradient accumulation only with TE >= 2.10
    # (mcore_fsdp_adapter.py:147-151); the fixture's TE is older
    fused_wgrad = m.gradient_accumulation_fusion and cfg.optimizer.fsdp == "none"
    assert config.persist_layer_norm and config.gradient_accumulation_fusion == fused_wgrad
    assert config.cross_entropy_loss_fusion and config.cross_entropy_fusion_impl == "native"
    off = {"bias_activation_fusion": not config.bias_activation_fusion,
           "apply_rope_fusion": m.position_embedding != "rope",  # hybrids: no positions
           "gradient_accumulation_fusion": not fused_wgrad}
    on = [f for f in FUSIONS if not off.get(f, False)]
    assert fusions_line(config).startswith(f"layers: Transformer Engine's; fusions on: "
                                           f"{', '.join(on)}; off: ")


@pytest.mark.parametrize("name", [n for n in RECIPES if get_recipe(n).optimizer.fsdp != "none"])
def test_fsdp_wgrad_fusion_with_te_2_10(name, te_kernels, monkeypatch):
    """With TE 2.10 or newer, Megatron FSDP runs fuse the weight-gradient accumulation too,
    unless the recipe turns it off (Bridge's Llama 3 8B FSDP configuration does)."""
    import megatron.core.utils

    monkeypatch.setattr(megatron.core.utils, "is_te_min_version", lambda *args, **kw: True)
    cfg = get_recipe(name)
    config = build_transformer_config(cfg, cpu_initialization=False, transformer_engine=True)
    assert config.gradient_accumulation_fusion == cfg.model.gradient_accumulation_fusion
    cfg.model.gradient_accumulation_fusion = True
    config = build_transformer_config(cfg, cpu_initialization=False, transformer_engine=True)
    assert config.gradient_accumulation_fusion


def test_wgrad_fusion_off_reaches_megatron_and_its_flag(te_kernels):
    """`model.gradient_accumulation_fusion=false` is Megatron's field and Megatron-LM's
    `--no-gradient-accumulation-fusion`; on (the default) writes no flag."""
    from recipes.config.megatron_args import to_megatron_args

    cfg = get_recipe("llama3_8b_tp8_dp8")
    assert "--no-gradient-accumulation-fusion" not in to_megatron_args(cfg)
    cfg.model.gradient_accumulation_fusion = False
    config = build_transformer_config(cfg, cpu_initialization=False, transformer_engine=True)
    assert not config.gradient_accumulation_fusion
    assert "--no-gradient-accumulation-fusion" in to_megatron_args(cfg)


def test_squared_relu_recipes_are_the_ones_without_the_activation_fusion(te_kernels):
    config = build_transformer_config(get_recipe("nemotron4_15b_tp8_pp2_dp4"),
                                      cpu_initialization=False, transformer_engine=True)
    assert not config.bias_activation_fusion and config.apply_rope_fusion


def test_without_apex_transformer_engines_wgrad_fusion_stays_on(monkeypatch):
    """TE's linears fuse the weight-gradient accumulation without APEX; only Megatron's own
    output layer would need it (kept unfused by the wgrad_fusion_without_apex patch, below)."""
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *args: None)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    config = build_transformer_config(get_recipe("llama3_8b_tp8_dp8"), cpu_initialization=False,
                                      transformer_engine=True)
    assert config.gradient_accumulation_fusion and config.bias_activation_fusion


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo world with Megatron's process groups, torn down after the test."""
    with one_rank_world(tmp_path) as initialize:
        yield initialize


@pytest.mark.parametrize("skip", [False, True])
def test_wgrad_fusion_without_apex_builds_megatrons_own_linears_unfused(one_rank, skip,
                                                                        monkeypatch):
    """The wgrad_fusion_without_apex patch (trainer/gpu_fast_paths.py): a config asking for the
    fusion without APEX builds, and Megatron's own linears keep the unfused accumulation (their
    forward reads the flag, tensor_parallel/layers.py:1172); without the patch Megatron refuses
    to build them (layers.py:1070-1079)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear

    from plugins.protocol.hooks import PluginSet
    from trainer.gpu_fast_paths import WGRAD_PATCH, wgrad_fusion_without_apex
    from trainer.model import build_model_chunks

    assert WGRAD_PATCH == "wgrad_fusion_without_apex"
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    cfg = get_recipe("tiny_dp1")
    one_rank(cfg)
    config = build_transformer_config(cfg, cpu_initialization=True)
    config.gradient_accumulation_fusion = True
    chunks: list = []
    if skip:
        with pytest.raises(RuntimeError, match="fused_weight_gradient_mlp_cuda"):
            with wgrad_fusion_without_apex(config, chunks, skip=True):
                chunks += build_model_chunks(cfg, config, PluginSet())
        return
    with wgrad_fusion_without_apex(config, chunks):
        chunks += build_model_chunks(cfg, config, PluginSet())
    linears = [m for m in chunks[0].modules() if isinstance(m, ColumnParallelLinear)]
    assert linears and not any(linear.gradient_accumulation_fusion for linear in linears)
    assert not layers._grad_accum_fusion_available  # APEX's flag is Megatron's again


def test_the_fast_paths_reach_megatron_on_transformer_engine_and_stay_off_on_cpu(te_kernels):
    """Bridge's Nemotron 3 Nano fast paths: every one in TransformerConfig with TE's layers;
    with the local layers (CPU ranks) none, the flex dispatcher replaced by alltoall (the same
    routing) and selective recompute kept."""
    cfg = get_recipe("nemotron3_nano_30b_a3b_tp4_sp_ep8_dp16")
    te = build_transformer_config(cfg, cpu_initialization=False, transformer_engine=True)
    assert (te.moe_token_dispatcher_type, te.moe_flex_dispatcher_backend) == ("flex", "hybridep")
    assert te.moe_grouped_gemm and te.moe_permute_fusion and te.use_fused_weighted_squared_relu
    assert te.tp_comm_overlap and te.use_te_rng_tracker
    assert te.cuda_graph_impl == "transformer_engine" and te.cuda_graph_warmup_steps == 3
    assert te.recompute_modules == ["moe", "layernorm"]
    local = build_transformer_config(cfg, cpu_initialization=True)
    assert local.moe_token_dispatcher_type == "alltoall"
    assert not (local.moe_grouped_gemm or local.moe_permute_fusion or local.tp_comm_overlap
                or local.use_fused_weighted_squared_relu or local.use_te_rng_tracker)
    assert local.cuda_graph_impl == "none" and local.recompute_modules == ["moe", "layernorm"]


def test_offloading_and_ep_overlap_reach_megatron(te_kernels):
    cfg = apply_overrides(get_recipe("mixtral_tiny_ep2_dp2"), [
        "precision.dtype=bf16", "parallel.ep_comm_overlap=true", "model.moe_grouped_gemm=true",
        "train.recompute=selective", "train.recompute_modules=[moe_act,layernorm]",
        "train.offload_modules=[core_attn,attn_proj,expert_fc1]"])
    te = build_transformer_config(cfg, cpu_initialization=False, transformer_engine=True)
    assert te.overlap_moe_expert_parallel_comm and te.fine_grained_activation_offloading
    assert te.offload_modules == ["core_attn", "attn_proj", "expert_fc1"]
    assert te.recompute_modules == ["moe_act", "layernorm"]
    local = build_transformer_config(cfg, cpu_initialization=True)
    # moe_act is recomputed only in grouped-GEMM experts, which CPU ranks do not build.
    assert local.recompute_modules == ["layernorm"]
    assert not (local.overlap_moe_expert_parallel_comm or local.fine_grained_activation_offloading)


@pytest.mark.parametrize("name", ["tiny_dp1", "llama3_8b_tp8_dp8", "mixtral_tiny_ep1"])
def test_local_layers_keep_megatrons_defaults(name):
    config = build_transformer_config(get_recipe(name), cpu_initialization=True)
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    assert {k: getattr(config, k) for k in FUSIONS} == {k: defaults[k] for k in FUSIONS}


GPU_NODE = MachineInfo(gpus=4, launched_world_size=None, compute_capability=(9, 0),
                       transformer_engine=None)


def test_a_gpu_node_without_transformer_engine_is_refused_before_launch():
    cfg = apply_overrides(get_recipe("tiny_tp2_pp2"), [])
    with pytest.raises(ConfigError) as caught:
        check_machine(cfg, GPU_NODE, local_attention_cost=local_attention_cost)
    assert str(caught.value) == (
        "model.transformer_impl=auto builds Transformer Engine's layers on GPUs, but "
        "Transformer Engine is not installed here; install the gpu extra (pip install -e "
        "'.[gpu]', docs/precision.md), or run Megatron Core's local layers with "
        "model.transformer_impl=local (unfused attention that keeps every score: 0.26 MB per "
        "layer and micro-batch at seq_length 128; no FP8, no packed THD)")
    check_machine(apply_overrides(cfg, ["model.transformer_impl=local"]), GPU_NODE)
    with_te = dataclasses.replace(GPU_NODE, transformer_engine="2.8.0")
    check_machine(cfg, with_te)


def test_the_score_memory_is_the_planners_score_term():
    """b x heads/TP x s x s x bytes: Llama-3-8B at TP8, mbs 2, bf16, seq 8192 keeps
    2 x 32/8 x 8192^2 x 2 bytes = 1.07 GB per layer; attention dropout adds a one-byte mask and
    a bf16 output per score, 2.5x that; the planner's explicit activations hold the same."""
    from recipes.plan.activations import attention_score_bytes, layer_bytes

    cfg = get_recipe("llama3_8b_tp8_dp8")
    assert attention_score_bytes(cfg) == 2 * 32 // 8 * 8192 ** 2 * 2
    dropout = apply_overrides(cfg, ["model.attention_dropout=0.1"])
    assert attention_score_bytes(dropout) == 2.5 * attention_score_bytes(cfg)
    kept = layer_bytes(cfg, "explicit") - layer_bytes(cfg, "flash")
    flash_lse = 2 * 8192 * 4 * 32 / 8
    assert kept == attention_score_bytes(cfg) - flash_lse
    assert local_attention_cost(cfg) == "1.07 GB per layer and micro-batch at seq_length 8192"


def test_cpu_ranks_cannot_be_asked_for_transformer_engine():
    cfg = apply_overrides(get_recipe("tiny_dp2"), ["model.transformer_impl=transformer_engine"])
    cpu = MachineInfo(gpus=0, launched_world_size=None, compute_capability=None,
                      transformer_engine=None)
    with pytest.raises(ConfigError, match="needs GPU ranks, but this run's ranks are on CPU"):
        check_machine(cfg, cpu)


def test_the_dry_run_builds_transformer_engine_layers_on_the_meta_device(monkeypatch):
    """On a GPU login node with TE the dry run hands TE's layers the meta device: CPU
    initialisation would allocate every shard for real (extensions/transformer_engine.py)."""
    from megatron.core.extensions import transformer_engine as te_extension

    from trainer import model
    from trainer.tools import dry_run

    seen = {}

    def capture(cfg, config, plugins):
        seen["config"] = config
        raise StopIteration  # the TE layers themselves need the package: stop before them

    monkeypatch.setattr(model, "transformer_engine_in_use", lambda cfg: True)
    monkeypatch.setattr(model, "build_model_chunks", capture)
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *args: None)
    with pytest.raises(StopIteration):
        dry_run._build_on_meta(get_recipe("tiny_dp1"), plugins=_no_plugins())
    config = seen["config"]
    assert config.init_model_with_meta_device and not config.use_cpu_initialization
    monkeypatch.setattr(te_extension, "is_te_min_version", lambda version: True)
    assert te_extension._get_extra_te_kwargs(config)["device"] == "meta"


def _no_plugins():
    from plugins.protocol.hooks import PluginSet

    return PluginSet()


def test_the_local_layers_on_gpus_are_said_with_their_score_memory(capsys):
    """Asked for explicitly, the local layers run, and the pre-flight says what they cost:
    mbs 2 x 32/8 heads x 8192^2 scores x 2 bytes = 1.07 GB per layer for Llama-3-8B at TP8."""
    from trainer.entry.pipeline import preflight

    cfg = apply_overrides(get_recipe("tiny_tp2_pp2"), ["model.transformer_impl=local"])
    preflight(cfg, GPU_NODE)
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("note: model.transformer_impl=local runs Megatron "
                                          "Core's unfused attention on the GPUs")
    from recipes.plan.fit import local_attention_note

    assert "keeps its scores: 1.07 GB per layer and micro-batch at seq_length 8192" in \
        local_attention_note(get_recipe("llama3_8b_tp8_dp8"))


def test_the_gpu_tiers_fast_path_runs_are_valid_configs_with_the_fast_paths_on():
    """tests/gpu/test_fast_paths_gpu.py trains these on a GPU; here each is resolved and
    validated as pretrain.py would, and the fast run has the paths it reports on."""
    from recipes.config.fast_paths import fast_paths_on
    from recipes.resolve import resolve_config
    from tests.gpu.test_fast_paths_gpu import CASES, SIZE

    for recipe, model, fast in CASES.values():
        plain = resolve_config([f"recipe={recipe}", *SIZE, *model])
        quick = resolve_config([f"recipe={recipe}", *SIZE, *model, *fast])
        on = fast_paths_on(quick)
        assert "permute fusion" in on and "grouped gemm" in on
        assert any(name.startswith("CUDA graphs (transformer_engine") for name in on)
        assert not any(name.startswith("CUDA graphs") for name in fast_paths_on(plain))


def test_cuda_graphs_are_captured_after_the_warmup_steps_only(monkeypatch):
    """The trainer's TE graph helper (trainer/gpu_fast_paths.py CudaGraphs) captures once, at
    the first step after `cuda_graph_warmup_steps` from where the session started, with the DP
    all-gather's forward hooks off while capturing (Megatron-LM's order)."""
    from types import SimpleNamespace

    from trainer import gpu_fast_paths

    calls = []

    class Helper:
        captured = False

        def __init__(self, **kwargs):
            calls.append(("init", kwargs["seq_length"], kwargs["micro_batch_size"]))

        def capture_finished(self):
            return self.captured

        def create_cudagraphs(self):
            calls.append("capture")
            self.captured = True

        def cuda_graph_set_manual_hooks(self):
            calls.append("manual hooks")

        def graphs_created(self):
            return self.captured

        def delete_cuda_graphs(self):
            calls.append("delete")

    class Chunk:
        def disable_forward_pre_hook(self, param_sync):
            calls.append(("hooks off", param_sync))

        def enable_forward_pre_hook(self):
            calls.append("hooks on")

    from megatron.core.transformer import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "TECudaGraphHelper", Helper)
    monkeypatch.setattr("torch.distributed.get_rank", lambda: 1)
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["train.cuda_graphs=transformer_engine",
                                                   "train.cuda_graph_warmup_steps=2",
                                                   "optimizer.distributed=true",
                                                   "optimizer.overlap_param_gather=true"])
    session = SimpleNamespace(cfg=cfg, model=[Chunk()], optimizer=object(), start_step=10)
    graphs = gpu_fast_paths.CudaGraphs(session, SimpleNamespace(
        cuda_graph_impl="transformer_engine"))
    for step in range(10, 15):
        graphs.before_step(step)
    graphs.close()
    assert calls == [("init", 128, 2), ("hooks off", False), "capture", "hooks on",
                     "manual hooks", "delete"]
    none = gpu_fast_paths.CudaGraphs(session, SimpleNamespace(cuda_graph_impl="none"))
    none.before_step(12)
    none.close()
    assert none.helper is None


def test_a_gpu_node_without_the_fast_paths_kernels_is_refused_before_launch():
    """DeepEP (or its HybridEP) for the flex dispatcher, a TE recent enough for the fused MoE
    kernels: one line each on a GPU node; CPU ranks run without them."""
    cfg = apply_overrides(get_recipe("mixtral_tiny_ep4_dp4"), [
        "model.moe_token_dispatcher=flex", "model.moe_flex_backend=hybridep",
        "model.moe_router_fusion=true"])
    node = dataclasses.replace(GPU_NODE, transformer_engine="2.8.0")
    with pytest.raises(ConfigError) as caught:
        check_machine(cfg, dataclasses.replace(node, flex_backends=("deepep",)))
    assert str(caught.value).startswith(
        "model.moe_token_dispatcher=flex with model.moe_flex_backend=hybridep needs DeepEP's "
        "HybridEP kernels, which are not installed here")
    with pytest.raises(ConfigError, match=r"^model.moe_router_fusion=true needs Transformer "
                                          r"Engine >= 2.7, found 2.6.0"):
        check_machine(cfg, dataclasses.replace(node, transformer_engine="2.6.0",
                                               flex_backends=("deepep", "hybridep")))
    check_machine(cfg, dataclasses.replace(node, flex_backends=("deepep", "hybridep")))
    cpu = MachineInfo(gpus=0, launched_world_size=None)
    check_machine(cfg, cpu)  # CPU ranks: alltoall, no fused kernels (the plan line says so)


@pytest.mark.parametrize(("source", "found"), [
    ("class Buffer: ...\n", ("deepep",)),
    ("class Buffer: ...\nclass HybridEPBuffer: ...\n", ("deepep", "hybridep"))])
def test_the_flex_backends_are_read_from_deepeps_package_without_importing_it(
        tmp_path, monkeypatch, source, found):
    from recipes.config.machine import flex_backends

    assert flex_backends() == ()  # not installed on this machine
    package = tmp_path / "deep_ep"
    package.mkdir()
    (package / "__init__.py").write_text(source + "raise ImportError('needs CUDA')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert flex_backends() == found


def test_layernorm_recompute_of_fused_norms_is_refused_on_gpu_ranks_only():
    """On a GPU node Transformer Engine's QKV and FC1 linears hold a dense model's norms:
    `layernorm` would recompute nothing there (one line); CPU ranks' local layers recompute
    them, and a model with MoE layers has a norm of its own to recompute."""
    norms = ["train.recompute=selective", "train.recompute_modules=[core_attn,layernorm]"]
    dense = apply_overrides(get_recipe("tiny_dp2"), norms)
    node = dataclasses.replace(GPU_NODE, transformer_engine="2.8.0")
    with pytest.raises(ConfigError) as caught:
        check_machine(dense, node)
    assert str(caught.value) == (
        "train.recompute_modules has layernorm, but on GPU ranks Transformer Engine's QKV and "
        "FC1 linears hold the norms and the model has no MoE layer with a norm of its own "
        "(Megatron recomputes nothing); remove layernorm, or recompute mlp to free more")
    check_machine(dense, MachineInfo(gpus=0, launched_world_size=None))
    check_machine(apply_overrides(dense, ["model.transformer_impl=local"]), node)
    check_machine(apply_overrides(get_recipe("mixtral_tiny_ep4_dp4"), norms), node)


def test_offloading_inside_a_graph_of_attention_needs_te_2_14():
    """transformer_layer.py:1495-1513 asserts TE 2.14 in every layer's constructor when a
    graph of attention holds an offloaded module; graphs of the rest, or TE 2.14, pass."""
    graphed = ["train.cuda_graphs=transformer_engine", "train.cuda_graph_modules=[attn]",
               "train.offload_modules=[core_attn]"]
    cfg = apply_overrides(get_recipe("tiny_dp2"), graphed)
    node = dataclasses.replace(GPU_NODE, transformer_engine="2.13.0")
    with pytest.raises(ConfigError) as caught:
        check_machine(cfg, node)
    assert str(caught.value) == (
        "train.offload_modules has core_attn inside Transformer Engine's graph of attention "
        "(train.cuda_graph_modules has attn), which needs Transformer Engine >= 2.14.0, found "
        "2.13.0; upgrade Transformer Engine, or remove attn from train.cuda_graph_modules or "
        "core_attn from train.offload_modules")
    check_machine(cfg, dataclasses.replace(node, transformer_engine="2.14.0"))
    check_machine(apply_overrides(cfg, ["train.cuda_graph_modules=[mlp]"]), node)
