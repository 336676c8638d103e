"""The CPU runtime (the trainer's backend without CUDA), without a process group.

Activation is process-wide, so each patch's check runs in a process of its own: once with every
patch (must pass) and once with that patch skipped (must fail), each forked from one interpreter
that imported torch and Megatron Core once, at most one per core at once (tests/forked.py). The
norm/spec helpers and config validation need no activation and run in-process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
import torch

from tests.forked import run_forked
from tests.unit.test_megatron_fixes import check_outcomes

# ---- checks that run inside an activated process ----------------------------------------


def check_device_redirect() -> None:
    made = [
        torch.zeros(2, device="cuda"),
        torch.empty(2, device="cuda:1"),
        torch.ones(2, device=torch.device("cuda")),
        torch.full((2,), 1.0, device=0),  # the int torch.cuda.current_device() returns
        torch.ones(2).to("cuda"),
        torch.ones(2).to(0),
        torch.ones(2).to(device=torch.device("cuda", 0)),
        torch.ones(2).new_zeros(3, device="cuda"),
        torch.ones(2, pin_memory=True),
    ]
    assert [t.device.type for t in made] == ["cpu"] * len(made)
    tensor = torch.ones(2)
    assert tensor.cuda() is tensor and tensor.pin_memory() is tensor


def check_cuda_type_names() -> None:
    # The strings Megatron's optimizers assert on (clip_grads.py:174, optimizer.py:1009/1028).
    assert torch.zeros(2).type() == "torch.cuda.FloatTensor"
    assert torch.zeros(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
    assert torch.zeros(2, dtype=torch.float16).type() == "torch.cuda.HalfTensor"
    converted = torch.zeros(2).type(torch.float64)
    assert converted.dtype == torch.float64 and converted.device.type == "cpu"
    assert torch.zeros(2).type("torch.cuda.DoubleTensor").dtype == torch.float64


def check_cuda_stand_ins() -> None:
    from trainer.cpu_runtime.cuda_api import CUDA_STAND_INS

    assert torch.cuda.current_device() == 0 and torch.cuda.is_available() is False
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    side_stream = torch.cuda.Stream()
    with torch.cuda.stream(side_stream):
        doubled = torch.ones(2) * 2
    torch.cuda.current_stream().wait_stream(side_stream)
    event = torch.cuda.Event()
    event.record()
    event.wait()
    event.synchronize()
    torch.cuda.default_stream().synchronize()
    assert doubled.record_stream(torch.cuda.current_stream()) is None
    assert event.query() and doubled.tolist() == [2.0, 2.0]
    # Never touching the driver is the point (with a GPU these calls would initialise CUDA).
    assert not torch.cuda.is_initialized()
    installed = [getattr(torch.cuda, name) for name in CUDA_STAND_INS]
    assert len({id(obj) for obj in installed}) == len(installed)
    # torch._dynamo indexes torch's functions and asserts on one object with two rules.
    from torch._dynamo import trace_rules

    trace_rules.get_torch_obj_rule_map()


def _draws(seed: int, count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(3, generator=generator) for _ in range(count)]


def check_rng() -> None:
    import megatron.core.tensor_parallel.random as megatron_random

    torch.cuda.manual_seed(7)
    assert torch.equal(torch.rand(3), _draws(7, 1)[0])
    state = torch.cuda.get_rng_state()
    first = torch.rand(3)
    torch.cuda.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)

    warnings: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = warnings.append
    logging.getLogger(megatron_random.__name__).addHandler(handler)
    tracker = megatron_random.CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 1234)
    torch.manual_seed(5)
    before_fork = torch.get_rng_state()
    with tracker.fork("model-parallel-rng"):
        inside_first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), before_fork)  # fork restored the default stream
    with tracker.fork("model-parallel-rng"):
        inside_second = torch.rand(3)
    expected = _draws(1234, 2)
    assert torch.equal(inside_first, expected[0]) and torch.equal(inside_second, expected[1])
    assert warnings == []  # the shared-generator warning is expected on CPU and filtered


def check_eager() -> None:
    traced = []

    def counting_backend(graph_module, example_inputs):
        traced.append(graph_module)
        return graph_module.forward

    def double_plus_one(x):
        return x * 2 + 1

    compiled = torch.compile(double_plus_one, backend=counting_backend)
    assert compiled(torch.ones(2)).tolist() == [3.0, 3.0]
    assert traced == []


class _AllocatesOnCudaInBackward(torch.autograd.Function):
    """Like Megatron's SP linear (tensor_parallel/layers.py:646): backward allocates on the
    CUDA device it gets from torch.cuda.current_device()."""

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        scale = torch.full(grad.shape, 3.0, device=torch.cuda.current_device())
        return grad * scale


def _recomputed(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(_AllocatesOnCudaInBackward.apply(x), p=0.5).sum()


def check_backward_in_mode() -> None:
    from megatron.core.tensor_parallel.random import checkpoint, get_cuda_rng_tracker

    x = torch.ones(4, requires_grad=True)
    _AllocatesOnCudaInBackward.apply(x).sum().backward()
    torch.autograd.backward([_AllocatesOnCudaInBackward.apply(x).sum()], [torch.tensor(2.0)])
    assert x.grad.tolist() == [9.0] * 4  # 3 + 2 * 3
    (grad,) = torch.autograd.grad(_AllocatesOnCudaInBackward.apply(x).sum(), [x])
    assert grad.tolist() == [3.0] * 4
    # Megatron's activation recompute runs torch.autograd.backward inside a backward, and must
    # reproduce the dropout mask of the first forward.
    get_cuda_rng_tracker().add("model-parallel-rng", 11)
    torch.manual_seed(3)
    plain = torch.ones(4, requires_grad=True)
    _recomputed(plain).backward()
    torch.manual_seed(3)
    recomputed = torch.ones(4, requires_grad=True)
    checkpoint(_recomputed, False, recomputed).backward()
    assert torch.equal(plain.grad, recomputed.grad) and plain.grad.abs().sum() > 0


def check_mamba_kernels() -> None:
    # What the Mamba mixer reads at call time (megatron/core/ssm/mamba_mixer.py:202, 417, 755).
    from megatron.core.ssm import mamba_mixer

    assert mamba_mixer.HAVE_MAMBA_SSM
    norm = mamba_mixer.ExtendedRMSNorm(8, eps=1e-5, group_size=4, norm_before_gate=False,
                                       device=torch.cuda.current_device())
    assert isinstance(norm, torch.nn.Module) and hasattr(norm, "sharded_state_dict")
    heads, headdim, groups, d_state = 2, 4, 2, 3
    conv_dim = heads * headdim + 2 * groups * d_state
    y = mamba_mixer.mamba_split_conv1d_scan_combined(
        torch.randn(1, 6, conv_dim + heads * headdim + heads), torch.randn(conv_dim, 4),
        torch.zeros(conv_dim), torch.zeros(heads), -torch.ones(heads), torch.ones(heads),
        chunk_size=4, headdim=headdim, ngroups=groups, seq_idx=torch.zeros(1, 6, dtype=torch.int32))
    assert norm(y).shape == (1, 6, heads * headdim)
    assert mamba_mixer._check_mamba_sequence_packing_support(False) == (True, None)


def check_offload_split() -> None:
    # Megatron's hybrid-device optimizer as get_megatron_optimizer builds it for
    # optimizer.cpu_offload (optimizer/__init__.py:525-537): half the state offloaded.
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    params = [torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16)) for _ in range(2)]
    optimizer = HybridDeviceOptimizer(
        params, offload_fraction=0.5, cpu_optimizer_cls=torch.optim.AdamW,
        gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True, pin_cpu_grads=False,
        pin_cpu_params=False, overlap_cpu_optimizer_d2h_h2d=False, lr=0.1)
    for param in params:
        param.grad = torch.ones_like(param)
    optimizer.step()
    assert len(optimizer.gpu_params_map_cpu_copy) == 1 and len(optimizer.cpu_optimizers) == 1
    assert all(param.float().lt(1).all() for param in params)  # both updated, one on each side


def check_moe_latent_projections() -> None:
    # What MoELayer builds its latent projections with (transformer/moe/moe_layer.py:264-289).
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.moe import moe_layer

    assert moe_layer.HAVE_TE
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2,
                               sequence_parallel=False)
    projection = moe_layer.TELinear(
        8, 4, parallel_mode="duplicated", config=config, init_method=torch.nn.init.ones_,
        bias=False, skip_bias_add=False, skip_weight_param_allocation=False, is_expert=False)
    out, bias = projection(torch.ones(3, 1, 8))
    assert out.shape == (3, 1, 4) and bias is None and torch.all(out == 8)
    assert projection.weight.tensor_model_parallel is False and projection.weight.allreduce


def check_gloo_one_worker() -> None:
    # A gloo group as Megatron makes them (torch.distributed.new_group, after activation) runs
    # on one worker thread, is a ProcessGroupGloo to torch's own type checks, and gathers.
    import tempfile

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    store = f"file://{tempfile.mkdtemp()}/store"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        backend = dist.new_group([0])._get_backend(torch.device("cpu"))
        assert isinstance(backend, distributed_c10d.ProcessGroupGloo)
        assert isinstance(backend, dist.ProcessGroupGloo)
        assert backend.options._threads == 1, f"{backend.options._threads} worker threads"
        out = torch.zeros(3)
        dist.all_gather_into_tensor(out, torch.ones(3), group=dist.new_group([0]))
        assert out.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


UNIT_CHECKS: dict[str, Callable[[], None]] = {
    "device_redirect": check_device_redirect,
    "cuda_type_names": check_cuda_type_names,
    "cuda_stand_ins": check_cuda_stand_ins,
    "rng": check_rng,
    "eager": check_eager,
    "gloo_one_worker": check_gloo_one_worker,
    "backward_in_mode": check_backward_in_mode,
    "mamba_kernels": check_mamba_kernels,
    "offload_split": check_offload_split,
    "moe_latent_projections": check_moe_latent_projections,
}
# Shown necessary by tests/dist/test_cpu_runtime_dist.py and test_context_parallel.py instead
# (they need a process group).
DIST_TESTED_PATCHES = {
    "gloo_uneven_all_gather", "all_to_all_list_splits", "backward_in_mode", "thd_cp_partition",
}
# Shown necessary in-process below with Transformer Engine's bindings planted (this machine has
# no TE), and for real on a GPU machine (tests/gpu/test_gpu_training.py, a CPU run beside TE).
IN_PROCESS_TESTED_PATCHES = {"no_te_kernels"}


def run_checks_in_this_process(device: str, skip: list[str], names: list[str]) -> None:
    """Subprocess body: activate (through `runtime_for` as a rank does, with `skip` the patches
    left out), run the named checks, print one JSON line of outcomes."""
    from recipes.config.schema import ClusterConfig
    from trainer.cpu_runtime.runtime import activate_cpu_runtime, cpu_runtime_active, runtime_for

    if skip:
        activate_cpu_runtime(2, skip=frozenset(skip))
    runtime = runtime_for(ClusterConfig(device=device, threads_per_rank=2))
    activate_cpu_runtime(3)  # a second activation is a no-op
    outcome: dict[str, object] = {
        "on_cpu": (runtime.device, runtime.backend, runtime.cpu_initialization),
        "active": cpu_runtime_active(),
        "threads": torch.get_num_threads(),
        **check_outcomes(UNIT_CHECKS, names),
    }
    print(json.dumps(outcome))


# ---- running the checks in fresh processes ----------------------------------------------


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[str, object]]:
    """'all' -> every check with every patch; patch name -> its check with that patch skipped.
    Each in a process of its own, forked from one that imported torch once (tests/forked.py)."""
    # "auto" must switch the runtime on exactly when there is no CUDA device.
    device = "cpu" if torch.cuda.is_available() else "auto"
    runs = {"all": [device, [], list(UNIT_CHECKS)],
            **{name: ["cpu", [name], [name]] for name in UNIT_CHECKS}}
    return run_forked("tests.unit.test_cpu_runtime:run_checks_in_this_process", runs)


def test_activation_reports_active_idempotent_and_sets_threads(outcomes):
    assert outcomes["all"]["on_cpu"] == ["cpu", "gloo", True]
    assert outcomes["all"]["active"] is True
    assert outcomes["all"]["threads"] == 2  # the second activation's 3 changed nothing


@pytest.mark.parametrize("patch", list(UNIT_CHECKS))
def test_check_passes_with_every_patch(outcomes, patch):
    assert outcomes["all"][patch] == "ok"


@pytest.mark.parametrize("patch", list(UNIT_CHECKS))
def test_check_fails_without_its_patch(outcomes, patch):
    assert outcomes[patch]["active"] is True
    assert outcomes[patch][patch] != "ok", f"{patch} check passed with the patch skipped"


def test_every_patch_has_a_self_test():
    from trainer.cpu_runtime.runtime import PATCH_NAMES

    assert set(PATCH_NAMES) == set(UNIT_CHECKS) | DIST_TESTED_PATCHES | IN_PROCESS_TESTED_PATCHES


def test_no_te_kernels_replace_what_megatron_bound_from_transformer_engine(monkeypatch):
    """Where TE is installed, Megatron binds TE's CUDA-only FusedAdam, multi-tensor kernels and
    router GEMM at import; the patch binds what Megatron binds without TE (torch's optimizers,
    its own local_multi_tensor_* helpers, no router GEMM), so CPU ranks run Megatron's torch
    code. Planted here (no TE on this machine); the GPU tier trains a CPU run beside real TE."""
    from megatron.core import optimizer
    from megatron.core.optimizer import clip_grads, distrib_optimizer
    from megatron.core.optimizer import optimizer as base
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.utils import local_multi_tensor_applier, local_multi_tensor_l2_norm

    from trainer.cpu_runtime.no_te_kernels import install_no_te_kernels

    te_bound = {optimizer: ["Adam", "SGD"], distrib_optimizer: ["Adam"],
                clip_grads: ["multi_tensor_applier", "l2_norm_impl", "multi_tensor_scale_impl",
                             "multi_tensor_scale_tensor_impl"],
                base: ["multi_tensor_applier", "multi_tensor_scale_impl"],
                moe_utils: ["te_general_gemm"]}
    for module, names in te_bound.items():
        for name in names:
            monkeypatch.setattr(module, name, "Transformer Engine's")
    monkeypatch.setattr(optimizer, "USING_PYTORCH_OPTIMIZER", False)
    monkeypatch.setattr(distrib_optimizer, "USING_TE_OPTIMIZER", True)
    monkeypatch.setattr(distrib_optimizer, "HAVE_APEX_OR_TE", True)
    install_no_te_kernels()
    assert (optimizer.Adam, optimizer.SGD) == (torch.optim.AdamW, torch.optim.SGD)
    assert optimizer.USING_PYTORCH_OPTIMIZER is True
    assert distrib_optimizer.Adam is torch.optim.Adam
    assert not distrib_optimizer.USING_TE_OPTIMIZER and not distrib_optimizer.HAVE_APEX_OR_TE
    assert clip_grads.multi_tensor_applier is local_multi_tensor_applier
    assert clip_grads.l2_norm_impl is local_multi_tensor_l2_norm
    assert clip_grads.multi_tensor_scale_tensor_impl is None
    assert base.multi_tensor_applier is local_multi_tensor_applier
    assert moe_utils.te_general_gemm is None


# ---- in-process: no activation -----------------------------------------------------------


def test_config_mistakes_are_refused():
    from plugins.protocol.errors import ConfigError
    from recipes.config.overrides import apply_overrides
    from recipes.config.validation import validate
    from recipes.registry import get_recipe
    from trainer.cpu_runtime.runtime import activate_cpu_runtime, cpu_runtime_active

    # Users meet the config's rule before launch; activation itself only guards bugs.
    cfg = apply_overrides(get_recipe("tiny_dp1"), ["cluster.threads_per_rank=0"])
    with pytest.raises(ConfigError, match="cluster.threads_per_rank=0 must be at least 1"):
        validate(cfg)
    with pytest.raises(ValueError, match="threads_per_rank=0 must be at least 1"):
        activate_cpu_runtime(0)
    with pytest.raises(ValueError, match="unknown CPU runtime patches"):
        activate_cpu_runtime(skip=frozenset({"nope"}))
    assert not cpu_runtime_active()


def test_gpu_and_auto_with_cuda_stay_inactive(monkeypatch):
    from recipes.config.schema import ClusterConfig
    from trainer.cpu_runtime.runtime import cpu_runtime_active, runtime_for

    assert runtime_for(ClusterConfig(device="gpu")).device == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime_for(ClusterConfig(device="auto")).backend == "nccl"
    assert not cpu_runtime_active()


def _sp_config(normalization: str = "LayerNorm"):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        qk_layernorm=True,
        normalization=normalization,
    )


@pytest.mark.parametrize(
    "normalization, norm_type", [("LayerNorm", torch.nn.LayerNorm), ("RMSNorm", torch.nn.RMSNorm)]
)
def test_sequence_parallel_torch_norm_builds_and_tags_params(normalization, norm_type):
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from trainer.cpu_runtime.runtime import SequenceParallelTorchNorm

    config = _sp_config(normalization)
    with pytest.raises(AssertionError, match="sequence parallel not supported"):
        WrappedTorchNorm(config=config, hidden_size=16, eps=1e-5)
    norm = SequenceParallelTorchNorm(config=config, hidden_size=16, eps=1e-5)
    assert isinstance(norm, norm_type) and norm.eps == 1e-5
    assert [p.sequence_parallel for p in norm.parameters()] == [True] * len(list(norm.parameters()))
    assert config.sequence_parallel is True  # the caller's config is left alone


def _norms_in(spec, found: list | None = None) -> list:
    """Every class used as a norm anywhere in a spec tree."""
    import dataclasses

    found = [] if found is None else found
    if isinstance(spec, type):
        found.append(spec)
    elif isinstance(spec, list):
        for item in spec:
            _norms_in(item, found)
    elif dataclasses.is_dataclass(spec):
        for spec_field in dataclasses.fields(spec):
            _norms_in(getattr(spec, spec_field.name), found)
    return found


def test_adapt_local_layer_spec_swaps_every_torch_norm():
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
    )
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from trainer.cpu_runtime.runtime import SequenceParallelTorchNorm, adapt_local_layer_spec

    config = _sp_config()
    layer_spec = get_gpt_layer_local_spec(qk_layernorm=True)
    block_spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, pp_rank=0)
    adapted_layer = adapt_local_layer_spec(layer_spec, config)
    adapted_block = adapt_local_layer_spec(block_spec, config)

    layer = adapted_layer.submodules
    attention = layer.self_attention.submodules
    assert {
        layer.input_layernorm,
        layer.pre_mlp_layernorm,
        attention.q_layernorm,
        attention.k_layernorm,
    } == {SequenceParallelTorchNorm}
    assert adapted_block.layer_norm is SequenceParallelTorchNorm
    assert len(adapted_block.layer_specs) == len(block_spec.layer_specs)
    for adapted in (adapted_layer, adapted_block):
        assert WrappedTorchNorm not in _norms_in(adapted)
    # The originals (shared, module-level specs in Megatron) are not modified.
    assert layer_spec.submodules.input_layernorm is WrappedTorchNorm
    assert block_spec.layer_norm is WrappedTorchNorm


def test_adapt_local_layer_spec_leaves_spec_alone_without_sequence_parallel():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from trainer.cpu_runtime.runtime import adapt_local_layer_spec

    config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2)
    spec = get_gpt_layer_local_spec()
    assert adapt_local_layer_spec(spec, config) is spec


def test_thd_partition_replaces_transformer_engines_cuda_split_too(monkeypatch):
    """Where TE is installed, Megatron's `tex` is TE's extension, whose per-document CP split is
    a CUDA kernel: CPU ranks get the torch stand-in for it, and TE's other names stay TE's."""
    import types

    from megatron.core import utils

    from trainer.cpu_runtime.cp_attention import install_thd_partition

    def cuda_only(*args):
        raise RuntimeError("Found no NVIDIA driver on your system")

    te_extension = types.SimpleNamespace(thd_get_partitioned_indices=cuda_only,
                                         other_kernel="TE's")
    monkeypatch.setattr(utils, "tex", te_extension)
    install_thd_partition()
    install_thd_partition()  # a second install keeps one wrapper
    index = utils.tex.thd_get_partitioned_indices(torch.tensor([0, 8, 24, 32]), 32, 2, 0)
    # Rank 0 of CP2 keeps chunks 0 and 3 of each document (2·CP chunks per document).
    assert index.tolist() == [0, 1, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23, 24, 25, 30, 31]
    assert utils.tex.other_kernel == "TE's"
