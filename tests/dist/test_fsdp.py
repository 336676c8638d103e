"""Megatron FSDP and optimizer CPU offload train what DDP with the distributed optimizer trains,
save and resume exactly.

From one reference (each case loads the initial weights the reference run saved): every
sharding level (`optim`, `optim_grads`, `optim_grads_params`) at DP2, ZeRO-3 at DP4 and at TP2 +
SP x DP2, the hybrid Mamba-Transformer model at DP2 and with its experts over EP2, per-step
losses equal to the distributed optimizer's within float tolerance; the hybrid-device optimizer
(all of the state offloaded, and half of it) equal to the same bf16 run without offload. Then
checkpoints: an fsdp_dtensor save resumes bit for bit at the same DP, resumes at DP4 and at TP2 x
DP2 within float tolerance, and an offloaded run resumes bit for bit. Last, the self-test of the
fix that keeps every rank's fsdp_dtensor state dict the same list of tensors. Beside them, a
ZeRO-3 run with overlapped gathers under `BucketFreeCheck`: no bucket freed while an unfinished
all-gather uses it.
"""

from __future__ import annotations

import pytest

from tests.dist.layout_runs import HYBRID_SIZE

pytestmark = pytest.mark.dist

LAYOUT = "tests.dist.layout_runs"
RESUME = "tests.dist.resume_runs"
STEPS, HYBRID_STEPS, SAVE_AFTER = 4, 3, 2
LOSS_TOLERANCE = 2e-5  # fp32 on CPU: shardings differ only in summation order (~2e-7 seen)


def _reference(launch_ranks, root, recipe, steps, overrides=()) -> tuple[str, dict]:
    result = launch_ranks(2, f"{LAYOUT}:train_steps", {
        "recipe": recipe, "steps": steps, "run_dir": str(root / "ref"),
        "weights_dir": str(root / "w"), "overrides": list(overrides)})[0]
    return result["weights"], result


@pytest.fixture(scope="module")
def reference(launch_ranks, tmp_path_factory):
    """DDP with the distributed optimizer at DP2; its initial weights, saved before training."""
    return _reference(launch_ranks, tmp_path_factory.mktemp("gpt"), "tiny_dp2_distopt", STEPS)


@pytest.fixture(scope="module")
def hybrid_reference(launch_ranks, tmp_path_factory):
    return _reference(launch_ranks, tmp_path_factory.mktemp("hybrid"), "hybrid_tiny_dp2_distopt",
                      HYBRID_STEPS, HYBRID_SIZE)


@pytest.fixture(scope="module")
def bf16_reference(launch_ranks, tmp_path_factory):
    return _reference(launch_ranks, tmp_path_factory.mktemp("bf16"), "tiny_dp2_distopt", STEPS,
                      ["precision.dtype=bf16"])


def _train(launch_ranks, recipe, ranks, overrides, weights, run_dir, steps) -> dict:
    results = launch_ranks(ranks, f"{LAYOUT}:train_steps", {
        "recipe": recipe, "steps": steps, "run_dir": str(run_dir),
        "overrides": [f"checkpoint.load={weights}", "checkpoint.load_model_only=true",
                      *overrides]})
    assert all(r["losses"] == results[0]["losses"] for r in results)
    return results[0]


def _assert_equal(label, result, expected):
    worst = max(abs(a - b) for a, b in zip(result["losses"], expected["losses"], strict=True))
    print(f"{label}: max |loss - distributed optimizer| = {worst:.2e}")
    assert result["losses"] == pytest.approx(expected["losses"], abs=LOSS_TOLERANCE, rel=0)
    assert result["grad_norms"] == pytest.approx(expected["grad_norms"], rel=1e-3)


CASES = [
    ("tiny_dp2_distopt", 2, ["optimizer.fsdp=optim"]),
    ("tiny_dp2_distopt", 2, ["optimizer.fsdp=optim_grads"]),
    ("tiny_dp2_fsdp", 2, []),
    ("tiny_dp2_fsdp", 4, ["cluster.gpus_per_node=4"]),
    ("tiny_tp2_sp_dp2_distopt", 4, ["optimizer.fsdp=optim_grads_params"]),
    ("tiny_dp2_fsdp", 2, ["optimizer.overlap_grad_reduce=true",
                          "optimizer.overlap_param_gather=true"]),
]


@pytest.mark.parametrize(("recipe", "ranks", "overrides"), CASES,
                         ids=[f"{r}-{n}{'+' + '+'.join(o) if o else ''}" for r, n, o in CASES])
def test_fsdp_equals_the_distributed_optimizer(launch_ranks, reference, tmp_path, recipe,
                                               ranks, overrides):
    weights, expected = reference
    result = _train(launch_ranks, recipe, ranks, overrides, weights, tmp_path, STEPS)
    _assert_equal(f"{recipe} x{ranks} {overrides}", result, expected)


def test_no_bucket_is_freed_while_a_gather_still_uses_it(launch_ranks, tmp_path):
    """ZeRO-3 with overlapped gathers and reduces, on gloo ranks where no stream order keeps a
    bucket alive: Megatron FSDP frees buckets, at times while a prefetched all-gather is
    unfinished (how often depends on gloo's timing: printed, not asserted), but never one that
    such an all-gather reads or writes. The self-test shows the check sees an unfinished
    all-gather's output as in use."""
    results = launch_ranks(2, "tests.dist.fsdp_runs:bucket_frees", {
        "recipe": "tiny_dp2_fsdp", "steps": STEPS, "run_dir": str(tmp_path),
        "overrides": ["optimizer.overlap_grad_reduce=true", "optimizer.overlap_param_gather=true"]})
    for rank, figures in enumerate(results):
        print(f"rank {rank}: {figures}")
        assert figures["frees"] > 0 and figures["collectives"] > 0
        assert figures["freed_in_use"] == []
    assert results[0]["self_test_seen"]


HYBRID_CASES = [
    ("hybrid_tiny_dp2_distopt", 2, ["optimizer.fsdp=optim_grads_params"]),
    ("hybrid_tiny_ep2_dp2", 2, ["optimizer.distributed=true", "optimizer.fsdp=optim_grads"]),
]


@pytest.mark.parametrize(("recipe", "ranks", "overrides"), HYBRID_CASES,
                         ids=[f"{r}+{o[-1]}" for r, _, o in HYBRID_CASES])
def test_hybrid_fsdp_equals_the_distributed_optimizer(launch_ranks, hybrid_reference, tmp_path,
                                                      recipe, ranks, overrides):
    weights, expected = hybrid_reference
    result = _train(launch_ranks, recipe, ranks, [*HYBRID_SIZE, *overrides], weights, tmp_path,
                    HYBRID_STEPS)
    _assert_equal(f"{recipe} {overrides}", result, expected)


@pytest.mark.parametrize("fraction", ["1.0", "0.5"])
def test_offload_equals_the_run_without_it(launch_ranks, bf16_reference, tmp_path, fraction):
    weights, expected = bf16_reference
    result = _train(launch_ranks, "tiny_dp2_bf16_offload", 2,
                    [f"optimizer.offload_fraction={fraction}"], weights, tmp_path, STEPS)
    _assert_equal(f"offload {fraction}", result, expected)


@pytest.fixture(scope="module")
def fsdp_saved(launch_ranks, tmp_path_factory) -> dict:
    """The uninterrupted ZeRO-3 run at DP2, saved (fsdp_dtensor) after SAVE_AFTER steps."""
    root = tmp_path_factory.mktemp("fsdp-saved")
    records = launch_ranks(2, f"{RESUME}:continuous", {
        "recipe": "tiny_dp2_fsdp", "steps": STEPS, "run_dir": str(root), "save_at": [SAVE_AFTER],
        "checkpoint_dir": str(root / "checkpoints")})
    return {"checkpoints": root / "checkpoints", "records": [r["records"] for r in records]}


def test_fsdp_dtensor_checkpoint_is_published_with_run_json(fsdp_saved):
    step = fsdp_saved["checkpoints"] / "step_0000002"
    names = {p.name for p in step.iterdir()}
    assert {"metadata.json", "run.json", ".metadata", "run_state.pt", "__0_rng.pt",
            "__1_rng.pt"} <= names
    from trainer.checkpoint.format import checkpoint_backend
    from trainer.checkpoint.manifest import read_manifest

    assert checkpoint_backend(step) == "fsdp_dtensor"
    assert set(read_manifest(step)["files"]) == names - {"run.json"}


def test_fsdp_resumes_bit_for_bit(launch_ranks, tmp_path, fsdp_saved):
    resumed = launch_ranks(2, f"{RESUME}:resumed", {
        "recipe": "tiny_dp2_fsdp", "steps": STEPS, "run_dir": str(tmp_path),
        "overrides": [f"checkpoint.load={fsdp_saved['checkpoints']}"]})
    for rank, (before, after) in enumerate(zip(fsdp_saved["records"], resumed, strict=True)):
        assert after["start"] == SAVE_AFTER
        assert after["records"] == before[SAVE_AFTER:], f"rank {rank}"


def _saved_adam_steps(step_dir) -> dict[str, float]:
    """Every parameter's Adam `step` as DCP stored it (one rank's copy of each)."""
    import torch
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(step_dir))
    keys = [k for k in reader.read_metadata().state_dict_metadata if k.endswith(".step")]
    steps = {key: torch.zeros(()) for key in keys}
    dcp.load(steps, storage_reader=reader, no_dist=True)
    return {key: float(value) for key, value in steps.items()}


def test_fsdp_resumes_bit_for_bit_from_a_later_save(launch_ranks, tmp_path):
    """A parameter whose shard on a rank is empty gets no update there: at every save its
    `step` there must be refreshed (`empty_shard_optimizer_state`), or DCP may keep a copy
    left from the earlier save, and the resume's bias correction drifts from the second
    update after it on."""
    steps, saves = 6, [2, 4]
    checkpoints = tmp_path / "checkpoints"
    common = {"recipe": "tiny_dp2_fsdp", "steps": steps}
    continuous = launch_ranks(2, f"{RESUME}:continuous", {
        **common, "run_dir": str(tmp_path / "continuous"), "save_at": saves,
        "checkpoint_dir": str(checkpoints)})
    later = checkpoints / f"step_{saves[-1]:07d}"
    assert set(_saved_adam_steps(later).values()) == {float(saves[-1])}
    resumed = launch_ranks(2, f"{RESUME}:resumed", {
        **common, "run_dir": str(tmp_path / "resumed"),
        "overrides": [f"checkpoint.load={later}"]})
    for rank, (before, after) in enumerate(zip(continuous, resumed, strict=True)):
        assert after["start"] == saves[-1]
        assert after["records"] == before["records"][saves[-1]:], f"rank {rank}"


@pytest.mark.parametrize(("recipe", "ranks", "overrides"), [
    ("tiny_dp2_fsdp", 4, ["cluster.gpus_per_node=4"]),
    ("tiny_tp2_sp_dp2_distopt", 4, ["optimizer.fsdp=optim_grads"]),
], ids=["dp4", "tp2_dp2_zero2"])
def test_fsdp_resumes_in_another_layout(launch_ranks, tmp_path, fsdp_saved, recipe, ranks,
                                        overrides):
    after = launch_ranks(ranks, f"{RESUME}:resumed", {
        "recipe": recipe, "steps": STEPS, "run_dir": str(tmp_path),
        "overrides": [*overrides, f"checkpoint.load={fsdp_saved['checkpoints']}"]})[0]
    expected = fsdp_saved["records"][0][SAVE_AFTER:]
    assert [(r["samples"], r["lr"]) for r in after["records"]] == [
        (r["samples"], r["lr"]) for r in expected]
    for got, want in zip(after["records"], expected, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], abs=LOSS_TOLERANCE)


def test_offload_resumes_bit_for_bit(launch_ranks, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    common = {"recipe": "tiny_dp2_bf16_offload", "steps": STEPS, "run_dir": str(tmp_path)}
    continuous = launch_ranks(2, f"{RESUME}:continuous", {
        **common, "save_at": [SAVE_AFTER], "checkpoint_dir": str(checkpoints)})
    resumed = launch_ranks(2, f"{RESUME}:resumed", {
        **common, "overrides": [f"checkpoint.load={checkpoints}"]})
    for before, after in zip(continuous, resumed, strict=True):
        assert after["records"] == before["records"][SAVE_AFTER:]


def test_empty_shard_optimizer_state_keeps_every_ranks_tensors_the_same(launch_ranks, tmp_path):
    """Without the fix, a parameter whose shard is empty on a rank has no Adam state there, so
    the ranks' lists differ (the save would hang); with it, every rank lists the same."""
    ranks = launch_ranks(2, "tests.dist.fsdp_runs:state_dict_tensors", {
        "recipe": "tiny_dp2_distopt", "run_dir": str(tmp_path),
        "overrides": ["optimizer.fsdp=optim_grads"]})
    assert ranks[0]["unfixed"] != ranks[1]["unfixed"]
    assert ranks[0]["fixed"] == ranks[1]["fixed"]
    assert set(ranks[0]["unfixed"]) | set(ranks[1]["unfixed"]) == set(ranks[0]["fixed"])


def test_swiglu_optimizer_keys_lets_a_swiglu_model_save(launch_ranks, tmp_path):
    """Megatron's SwiGLU split of the optimizer state looks its parameters up one `module.`
    short: without `swiglu_optimizer_keys` a SwiGLU model under Megatron FSDP cannot save once
    Adam has state; with it, each fc1's state is split into its gate and up halves."""
    ranks = launch_ranks(2, "tests.dist.fsdp_runs:swiglu_optimizer_state", {
        "recipe": "tiny_dp2_fsdp", "run_dir": str(tmp_path),
        "overrides": ["model.activation=swiglu"]})
    for rank in ranks:
        assert rank["unfixed"].startswith("AttributeError: MegatronFSDP has no attribute")
        assert rank["fixed"] and {key[-2:] for key in rank["fixed"]} == {"_w", "_v"}


def test_fsdp_weights_load_into_a_fresh_optimizer(launch_ranks, tmp_path, fsdp_saved):
    """`checkpoint.load_model_only` of an fsdp_dtensor save, at another level and DP: both
    start from the saved weights (their first losses, on the first batch, agree, and are the
    loss of the saved model, not the fresh model's on that batch)."""
    step = fsdp_saved["checkpoints"] / f"step_{SAVE_AFTER:07d}"
    first = []
    for ranks, overrides in ((2, ["optimizer.fsdp=optim_grads"]),
                             (4, ["cluster.gpus_per_node=4"])):
        result = launch_ranks(ranks, f"{LAYOUT}:train_steps", {
            "recipe": "tiny_dp2_fsdp", "steps": 1, "run_dir": str(tmp_path / str(ranks)),
            "overrides": [f"checkpoint.load={step}", "checkpoint.load_model_only=true",
                          *overrides]})[0]
        first.append(result["losses"][0])
    fresh = fsdp_saved["records"][0][0]["loss"]
    assert first[0] == pytest.approx(first[1], abs=LOSS_TOLERANCE)
    assert abs(first[0] - fresh) > 1e-3  # float noise between layouts is ~1e-7


def test_fsdp_resume_takes_this_runs_learning_rate(launch_ranks, tmp_path, fsdp_saved):
    """A resume with another `optimizer.lr` applies it (`adopt_hyperparameters` writes it into
    fsdp_dtensor's per-parameter groups; without that the saved lr silently stays): inside the
    warm-up the lr scales with the peak, a third of the saved run's."""
    after = launch_ranks(2, f"{RESUME}:resumed", {
        "recipe": "tiny_dp2_fsdp", "steps": STEPS, "run_dir": str(tmp_path),
        "overrides": ["optimizer.lr=1e-3", "optimizer.min_lr=1e-4",
                      f"checkpoint.load={fsdp_saved['checkpoints']}"]})[0]
    before = fsdp_saved["records"][0][SAVE_AFTER:]
    for got, want in zip(after["records"], before, strict=True):
        assert got["lr"] == pytest.approx(want["lr"] / 3, rel=1e-9)
