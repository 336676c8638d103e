"""`Layout` arithmetic against numbers known independently of it (no Megatron, no torch).

test_layout_groups.py compares every group with Megatron Core's; these tests pin the derived
sizes, placement strings and descriptions the planner, the machine check and the dry-run report
print, using figures worked out by hand for configurations A and B (8 nodes x 8 GPUs) and
the group lists in Megatron Core's `initialize_model_parallel` docstring.
"""

from __future__ import annotations

import pytest

from recipes.config.layout import Layout
from recipes.registry import get_recipe


def test_config_a_tp8_dp8_sizes():
    layout = get_recipe("llama3_8b_tp8_dp8").layout
    assert layout.world_size == 64
    assert layout.data_parallel == 8  # 64 / TP8
    assert layout.microbatches == 8  # global batch 128 / (micro-batch 2 x DP8)
    assert layout.layers_per_stage == 32  # no pipelining: all 32 layers on each rank
    assert layout.group_of("dp", 0) == [0, 8, 16, 24, 32, 40, 48, 56]  # GPU 0 of every node


def test_config_b_tp8_pp4_dp2_sizes():
    layout = get_recipe("llama3_8b_tp8_pp4_dp2").layout
    assert layout.data_parallel == 2  # 64 / (TP8 x PP4)
    assert layout.microbatches == 8  # global batch 32 / (micro-batch 2 x DP2)
    assert layout.layers_per_stage == 8  # 32 layers / PP4
    assert layout.layers_per_chunk == 8  # no virtual stages


def test_config_b_tp_groups_stay_in_a_node_and_dp_and_pp_groups_leave_it():
    layout = get_recipe("llama3_8b_tp8_pp4_dp2").layout
    for group in layout.groups("tp"):
        assert not layout.crosses_nodes(group)
        assert len(group) == 8
    # DP sits inside PP in Megatron's order: rank 0's replica partner is rank 8, on node 1.
    assert layout.group_of("dp", 0) == [0, 8]
    assert layout.crosses_nodes([0, 8])
    assert layout.group_of("pp", 0) == [0, 16, 32, 48]  # one stage every two nodes
    assert layout.placement([0, 16, 32, 48]) == "N0:G0 N2:G0 N4:G0 N6:G0"


def test_config_b_stage_placement_and_embedding_groups():
    layout = get_recipe("llama3_8b_tp8_pp4_dp2").layout
    stage0 = [r for r in range(64) if layout.coordinates(r).pp == 0]
    assert layout.placement(stage0) == "N0:G0-G7 N1:G0-G7"
    stage3 = [r for r in range(64) if layout.coordinates(r).pp == 3]
    assert layout.placement(stage3) == "N6:G0-G7 N7:G0-G7"
    # First and last stage share the tied embedding; middle stages hold none.
    assert layout.group_of("embedding", 0) == [0, 48]
    assert layout.group_of("embedding", 63) == [15, 63]
    assert layout.group_of("embedding", 16) is None


def test_megatron_docstring_example_tp2_pp4_on_16_gpus():
    """The 16-GPU example written out in `initialize_model_parallel`'s docstring."""
    layout = Layout(nodes=2, gpus_per_node=8, tensor=2, pipeline=4)
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11],
                                   [12, 14], [13, 15]]
    assert layout.groups("tp") == [[2 * i, 2 * i + 1] for i in range(8)]
    assert layout.groups("pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14],
                                   [3, 7, 11, 15]]
    assert layout.placement([0, 2]) == "N0:G0,G2"


@pytest.mark.parametrize(("name", "padded"), [
    ("llama3_8b_tp8_dp8", 129024),  # 128256 -> multiple of 128 x 8 = 1024: 126 x 1024
    ("llama3_70b_tp4_pp4_cp2_vpp5_dp2", 128512),  # multiple of 512: 251 x 512
    ("nemotron4_15b_tp8_pp2_dp4", 256000),  # 256000 = 250 x 1024 already
    ("mixtral_8x7b_tp1_pp4_ep8_dp16", 32000),  # 32000 = 250 x 128 already
])
def test_padded_vocab(name, padded):
    assert get_recipe(name).layout.padded_vocab == padded


def test_mixtral_expert_sizes_and_groups():
    layout = get_recipe("mixtral_8x7b_tp1_pp4_ep8_dp16").layout
    assert layout.data_parallel == 16  # 64 / PP4
    assert layout.expert_data_parallel == 2  # 64 / (PP4 x expert-TP1 x EP8)
    assert layout.group_of("ep", 0) == list(range(8))  # one node holds all 8 experts
    assert layout.group_of("expert-dp", 0) == [0, 8]  # each expert's two copies
    assert layout.group_of("dp", 0) == list(range(16))  # dense weights: 16 copies
    assert layout.coordinates(9).ep == 1
    assert layout.coordinates(9).dp == 9


def test_long_context_cp8_groups_and_sizes():
    layout = get_recipe("llama3_8b_128k_tp8_cp8").layout
    assert layout.data_parallel == 1  # 64 / (TP8 x CP8)
    assert layout.microbatches == 16  # global batch 16 / (micro-batch 1 x DP1)
    assert layout.group_of("cp", 0) == [0, 8, 16, 24, 32, 40, 48, 56]
    assert layout.crosses_nodes(layout.group_of("cp", 0))
    assert layout.group_of("dp", 0) == [0]
    assert layout.group_of("dp-cp", 0) == [0, 8, 16, 24, 32, 40, 48, 56]


def test_70b_virtual_stages_and_cp():
    layout = get_recipe("llama3_70b_tp4_pp4_cp2_vpp5_dp2").layout
    assert (layout.data_parallel, layout.model_chunks) == (2, 20)
    assert layout.layers_per_stage == 20  # 80 / PP4
    assert layout.layers_per_chunk == 4  # 80 / (PP4 x VPP5)
    assert layout.microbatches == 64  # 128 / (1 x DP2)
    assert layout.group_of("cp", 0) == [0, 4]
    assert layout.group_of("dp", 0) == [0, 8]
    assert layout.group_of("dp-cp", 0) == [0, 4, 8, 12]
    assert layout.group_of("tp-pp", 0) == [0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35,
                                           48, 49, 50, 51]


@pytest.mark.parametrize(("name", "text"), [
    ("llama3_8b_tp8_pp4_dp2", "TP8+SP x PP4 x DP2"),
    ("llama3_8b_128k_tp8_cp8", "TP8+SP x PP1 x CP8 x DP1"),
    ("llama3_70b_tp4_pp4_cp2_vpp5_dp2", "TP4+SP x PP4 (VPP5) x CP2 x DP2"),
    ("mixtral_8x7b_tp1_pp4_ep8_dp16", "TP1 x PP4 x DP16, EP8"),  # no SP in this recipe
    ("tiny_pp2_vpp2", "TP1 x PP2 (VPP2) x DP1"),
])
def test_describe(name, text):
    layout = get_recipe(name).layout
    assert layout.describe(show_sequence_parallel=True) == text
    assert layout.describe() == text.replace("+SP", "")


def test_node_gpu_and_place():
    layout = Layout(nodes=8, gpus_per_node=8, tensor=8)
    assert layout.node_gpu(13) == (1, 5)
    assert layout.place(63) == "N7:G7"
    assert layout.placement(list(range(8, 24))) == "N1:G0-G7 N2:G0-G7"
    assert not layout.crosses_nodes([8, 15])
    assert layout.crosses_nodes([7, 8])


def test_unknown_group_kind_is_refused():
    with pytest.raises(ValueError, match="unknown group kind"):
        Layout(nodes=1, gpus_per_node=1).groups("zz")  # type: ignore[arg-type]
