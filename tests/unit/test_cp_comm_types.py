"""Context parallel on Transformer Engine: the comm-type names are the ones Megatron Core
accepts (read from Megatron's own source), and a2a+p2p gets Megatron's hierarchical CP groups,
equal to the layout object's, or the run is refused."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import megatron.core.transformer.transformer_config as transformer_config

from plugins.context_parallel.config import ContextParallelConfig
from recipes.resolve import resolve_config
from tests.hang import HANG_S

REPO = Path(__file__).resolve().parents[2]
A2A_P2P = ["recipe=tiny_cp4", "cluster.gpus_per_node=8", "plugins.context_parallel.comm_type"
           "=a2a+p2p", "plugins.context_parallel.hierarchical_sizes=[2,2]"]


def megatron_cp_comm_types() -> set[str]:
    """The names the docstring of `TransformerConfig.cp_comm_type` lists as accepted."""
    tree = ast.parse(Path(transformer_config.__file__).read_text(encoding="utf-8"))
    config = next(node for node in tree.body
                  if isinstance(node, ast.ClassDef) and node.name == "TransformerConfig")
    for field, doc in zip(config.body, config.body[1:], strict=False):
        if isinstance(field, ast.AnnAssign) and getattr(field.target, "id", "") == "cp_comm_type":
            line = next(text for text in doc.value.value.splitlines() if "can be" in text)
            return set(re.findall(r'"([^"]+)"', line))
    raise AssertionError("TransformerConfig.cp_comm_type not found")


def test_comm_types_are_the_ones_megatron_accepts():
    ours = set(typing.get_args(typing.get_type_hints(ContextParallelConfig)["comm_type"]))
    assert ours == megatron_cp_comm_types() == {"p2p", "a2a", "all_gather", "a2a+p2p"}


def test_a2a_p2p_creates_the_layouts_hierarchical_groups_or_is_refused():
    result = subprocess.run([sys.executable, str(REPO / "tests" / "unit" / "cp_groups_probe.py"),
                             *A2A_P2P], capture_output=True, text=True, cwd=REPO, timeout=HANG_S,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                 "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads(result.stdout.splitlines()[-1])
    assert probe["options"] == {"hierarchical_context_parallel_sizes": [2, 2]}
    layout = resolve_config(A2A_P2P).layout
    assert layout.context == 4 and layout.data_parallel == 2
    levels = layout.hierarchical_context_groups([2, 2])
    for rank, record in enumerate(probe["with"]):
        ours = [next(g for g in level if rank in g) for level in levels]
        assert record["groups"] == ours, rank
        assert record["refusal"] is None
    for record in probe["without"]:
        assert record["groups"] == []
        assert record["refusal"].startswith("plugins.context_parallel.comm_type=a2a+p2p but "
                                            "Megatron's hierarchical context-parallel groups "
                                            "were not created")
