"""The CPU runtime's distributed patches, each shown necessary: the checks give the right answer
with every patch applied and fail (error or wrong answer) with that one patch left out.

Activation is process-wide, so every variant is its own launch. One 4-rank TP2 x DP2 launch
runs all checks with every patch; each "without" launch is 2 ranks running one check.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

pytestmark = pytest.mark.dist

ENTRY = "tests.dist.cpu_runtime_checks:run_checks"
# A rank's traceback that ends in torch's CUDA initialisation: without the patch, Megatron's
# code reached the CUDA device ("Found no NVIDIA driver", or in a forked rank "Cannot
# re-initialize CUDA"), not some other error that merely prints the word CUDA.
CUDA_REACHED = r'torch/cuda/__init__\.py", line \d+, in _lazy_init'
ALL_CHECKS = [
    "rng_streams",
    "uneven_all_gather",
    "all_to_all_split_tensors",
    "sp_linear_backward",
    "sp_norm_grads",
]


@pytest.fixture(scope="module")
def with_all_patches(launch_ranks) -> list[dict[str, Any]]:
    return launch_ranks(4, ENTRY, {"tp": 2, "checks": ALL_CHECKS})


def _launch_without(launch_ranks, patch: str, check: str) -> list[dict[str, Any]]:
    return launch_ranks(2, ENTRY, {"tp": 2, "checks": [check], "skip": [patch]})


# ---- RNG ---------------------------------------------------------------------------------


def _rng_layout_violations(results: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the RNG streams: model-parallel draws must differ between TP ranks
    and agree between DP ranks; default draws must agree everywhere."""
    draws = [rank["rng_streams"] for rank in results]
    violations = []
    for a in draws:
        for b in draws:
            same_tp = a["tp_rank"] == b["tp_rank"]
            if same_tp != (a["model_parallel"] == b["model_parallel"]):
                violations.append(
                    f"model-parallel stream of tp{a['tp_rank']}/dp{a['dp_rank']} "
                    f"vs tp{b['tp_rank']}/dp{b['dp_rank']}"
                )
            if a["default"] != b["default"]:
                violations.append("default stream differs between ranks")
    return violations


def test_rng_streams_distinct_per_tp_rank_equal_per_dp_rank(with_all_patches):
    assert {
        (r["rng_streams"]["tp_rank"], r["rng_streams"]["dp_rank"]) for r in with_all_patches
    } == {(0, 0), (1, 0), (0, 1), (1, 1)}
    assert _rng_layout_violations(with_all_patches) == []


def test_rng_streams_wrong_without_rng_patch(launch_ranks):
    try:
        results = _launch_without(launch_ranks, "rng", "rng_streams")
    except RuntimeError as error:
        assert re.search(CUDA_REACHED, str(error)), str(error)[-3000:]
        return
    assert _rng_layout_violations(results) != []


# ---- uneven all-gather -------------------------------------------------------------------


def _expected_gather(results: list[dict[str, Any]], rank: int) -> list[list[float]]:
    peers = results[rank]["uneven_all_gather"]["tp_group_ranks"]
    return [row for peer in peers for row in results[peer]["uneven_all_gather"]["local"]]


def test_uneven_all_gather_through_megatron_mapping(with_all_patches):
    # TP rank t contributed t + 1 rows, so the sizes really differ.
    assert [len(r["uneven_all_gather"]["local"]) for r in with_all_patches] == [1, 2, 1, 2]
    for rank, result in enumerate(with_all_patches):
        assert result["uneven_all_gather"]["gathered"] == _expected_gather(with_all_patches, rank)


def test_uneven_all_gather_fails_without_patch(launch_ranks):
    with pytest.raises(RuntimeError, match="invalid tensor size"):
        _launch_without(launch_ranks, "gloo_uneven_all_gather", "uneven_all_gather")


# ---- all_to_all_single with tensor split sizes -------------------------------------------


def _expected_all_to_all(results: list[dict[str, Any]], rank: int) -> list[list[float]]:
    mine = results[rank]["all_to_all_split_tensors"]
    my_tp_rank = mine["tp_group_ranks"].index(rank)
    received = []
    for peer in mine["tp_group_ranks"]:
        theirs = results[peer]["all_to_all_split_tensors"]
        start = sum(theirs["input_splits"][:my_tp_rank])
        received += theirs["local"][start : start + theirs["input_splits"][my_tp_rank]]
    return received


def test_all_to_all_with_tensor_split_sizes(with_all_patches):
    for rank, result in enumerate(with_all_patches):
        assert result["all_to_all_split_tensors"]["received"] == _expected_all_to_all(
            with_all_patches, rank
        )


def test_all_to_all_fails_without_list_split_sizes(launch_ranks):
    with pytest.raises(RuntimeError, match="incompatible function arguments"):
        _launch_without(launch_ranks, "all_to_all_list_splits", "all_to_all_split_tensors")


# ---- backward under the device mode ------------------------------------------------------


def test_sp_linear_forward_and_backward_match_full_weights(with_all_patches):
    for result in with_all_patches:
        assert result["sp_linear_backward"]["output_error"] < 1e-5
        assert result["sp_linear_backward"]["input_grad_error"] < 1e-5


def test_sp_linear_backward_hits_cuda_without_backward_in_mode(launch_ranks):
    with pytest.raises(RuntimeError, match=CUDA_REACHED):
        _launch_without(launch_ranks, "backward_in_mode", "sp_linear_backward")


# ---- sequence-parallel torch norm --------------------------------------------------------


def test_unadapted_local_spec_rejects_sequence_parallel(with_all_patches):
    for result in with_all_patches:
        assert "sequence parallel not supported" in result["sp_norm_grads"]["unadapted_spec_error"]


def test_sp_norm_grads_summed_over_tp_only_when_tagged(with_all_patches):
    # TP groups are ranks (0, 1) and (2, 3); every rank saw the same batch.
    for first, second in [(0, 1), (2, 3)]:
        a, b = with_all_patches[first]["sp_norm_grads"], with_all_patches[second]["sp_norm_grads"]
        assert (a["tp_rank"], b["tp_rank"]) == (0, 1)
        assert set(a["tagged"]) == set(a["untagged"]) and len(a["tagged"]) == 6  # 3 norms x 2
        for name in a["tagged"]:
            assert a["tagged"][name] == pytest.approx(b["tagged"][name], abs=1e-6)
            # Each TP rank's untagged grad is its own sequence shard's part of the sum.
            local_sum = [
                x + y for x, y in zip(a["untagged"][name], b["untagged"][name], strict=True)
            ]
            assert a["tagged"][name] == pytest.approx(local_sum, abs=1e-6)
        assert any(
            a["untagged"][name] != pytest.approx(b["untagged"][name], abs=1e-6)
            for name in a["untagged"]
        )
