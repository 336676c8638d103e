"""The worked numbers of configurations A and B (docs/reference-configurations.md) come out of
the planner exactly.

8B model state by precision and ZeRO stage, the [2, 2048, 4096] BF16 tensor, explicit attention
scores, the batch arithmetic of configs A and B, micro-batches in flight for all-forward vs
1F1B on the two-stage, three-micro-batch example, and the bubble.
"""

from __future__ import annotations

from recipes.plan.activations import score_bytes, tensor_bytes
from recipes.plan.batch import global_batch
from recipes.plan.build import make_plan
from recipes.plan.cluster import load_cluster
from recipes.plan.memory import model_state, state_bytes
from recipes.plan.schedule import bubble, in_flight_1f1b, in_flight_all_forward
from recipes.registry import get_recipe

GB, MIB, GIB = 10**9, 2**20, 2**30
EIGHT_B = 8 * 10**9
BF16 = state_bytes("bf16", grad_in_fp32=False)  # BF16 weights and grads, FP32 master + Adam
H100 = "conf/cluster/h100_80gb_8x8.yaml"


def test_sixteen_bytes_per_parameter_is_128_gb_for_8b():
    assert (BF16.weight, BF16.grad, BF16.master, BF16.moments) == (2, 2, 4, 8)
    assert BF16.total == 16
    state = model_state(EIGHT_B, 1, BF16, "none")
    assert (state.weights, state.grads, state.master, state.moments) == (
        16 * GB, 16 * GB, 32 * GB, 64 * GB)
    assert state.total == 128 * GB
    assert state.total - state.grads == 112 * GB  # resident before the first backward


def test_zero_stages_on_eight_gpus():
    per_gpu = {s: model_state(EIGHT_B, 8, BF16, s).total
               for s in ("none", "optim", "optim_grads", "optim_grads_params")}
    assert per_gpu == {"none": 128 * GB, "optim": 44 * GB, "optim_grads": 30 * GB,
                       "optim_grads_params": 16 * GB}
    assert model_state(EIGHT_B, 8, BF16, "dist_opt").total == 44 * GB  # Megatron's ZeRO-1


def test_zero3_on_sixty_four_gpus_is_2_gb():
    assert model_state(EIGHT_B, 64, BF16, "optim_grads_params").total == 2 * GB


def test_offload_moves_optimizer_state_off_the_gpu():
    state = model_state(EIGHT_B, 1, BF16, "none", offload=1.0)
    # 96 GB of FP32 master weights and moments, and the FP32 copy of the gradients Megatron's
    # hybrid-device optimizer steps them from (32 GB), in CPU memory
    assert state.total == 32 * GB and state.offloaded == 128 * GB
    half = model_state(EIGHT_B, 8, BF16, "dist_opt", offload=0.5)
    assert half.master + half.moments == 6 * GB and half.offloaded == 8 * GB


def test_megatron_bf16_bytes_per_parameter():
    """Megatron keeps FP32 main gradients by default: 18 B/param, 6 + 12/DP distributed."""
    per = state_bytes("bf16", grad_in_fp32=True)
    assert per.total == 18
    assert model_state(1000, 4, per, "dist_opt").total == 1000 * (6 + 12 / 4)
    assert state_bytes("fp32", grad_in_fp32=True).total == 16
    assert state_bytes("bf16", grad_in_fp32=True, fp8_weights=True).weight == 1


def test_activation_tensor_and_attention_scores():
    assert tensor_bytes(2, 2048, 4096) == 33_554_432 == 32 * MIB
    assert tensor_bytes(2, 8192, 4096) == 128 * MIB
    assert score_bytes(2, 32, 2048) == 512 * MIB
    assert score_bytes(2, 32, 8192) == 8 * GIB


def test_global_batch_of_configs_a_and_b():
    assert global_batch(2, 8, 8) == 128 and global_batch(2, 2, 8) == 32
    assert global_batch(2, 64, 8) == 1024
    assert global_batch(2, 8, 8) * 2048 == 262_144 and global_batch(2, 64, 8) * 2048 == 2_097_152
    cluster = load_cluster(H100)
    a = make_plan(get_recipe("8b_tp8_dp8"), cluster).batch
    b = make_plan(get_recipe("8b_tp8_pp4_dp2"), cluster).batch
    assert (a.micro_batch, a.data_parallel, a.accumulation, a.global_batch) == (2, 8, 8, 128)
    assert (b.micro_batch, b.data_parallel, b.accumulation, b.global_batch) == (2, 2, 8, 32)


def test_micro_batches_in_flight_all_forward_vs_1f1b():
    """Two stages, three micro-batches: N0 holds 3 with all forwards first, 2 with 1F1B."""
    assert in_flight_all_forward(3) == 3
    assert in_flight_1f1b(0, 2, 3) == 2
    assert in_flight_1f1b(1, 2, 3) == 1


def test_bubble_1f1b_and_interleaved():
    b = bubble(4, 1, 8)
    assert (b.slots, b.work_slots) == (3, 8) and b.fraction_of_step == 3 / 11
    assert bubble(4, 5, 64).fraction_of_ideal == 3 / 320
    assert bubble(1, 1, 8).fraction_of_step == 0
