"""Megatron-LM's checkpoint layout as the launching process sees it, without a process group:
its names on disk (`format.py`), its bookkeeping read without torch or pickled code
(`megatron_lm.py`), and the pre-flight's one-line refusals of what cannot resume. Real
checkpoints Megatron-LM's own loop wrote: tests/dist/test_megatron_lm_checkpoints.py.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.registry import get_recipe
from recipes.resolve import resolve_config
from tests.dcp_steps import dcp_step
from trainer.checkpoint.format import (
    MEGATRON_LM_TRACKER,
    complete_steps,
    newest_checkpoint,
    step_name,
    step_of,
)
from trainer.checkpoint.manifest import flatten, shape_mismatch, stated_changes
from trainer.checkpoint.megatron_lm import (
    Record,
    _scalars,
    _unpickle,
    config_from_args,
    rng_grid,
    rng_matches,
)
from trainer.checkpoint.preflight import check_checkpoint_load_path, checkpoint_preflight


def _step(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    return path


def test_both_layouts_name_their_steps() -> None:
    assert step_name(10) == "step_0000010"
    assert step_name(10, "megatron_lm") == "iter_0000010"
    assert step_of("iter_0000010") == step_of("step_0000010") == 10
    assert step_of("iter_10.tmp-1") is None and step_of("release") is None


def test_a_megatron_lm_root_resumes_from_what_its_tracker_names(tmp_path) -> None:
    root = tmp_path / "save"
    _step(root / "iter_0000002")
    _step(root / "iter_0000004")
    (root / MEGATRON_LM_TRACKER).write_text("2")
    assert newest_checkpoint(root) == root / "iter_0000002"
    (root / MEGATRON_LM_TRACKER).write_text("9")  # names nothing complete: the newest one
    assert newest_checkpoint(root) == root / "iter_0000004"
    assert [p.name for p in complete_steps(root)] == ["iter_0000002", "iter_0000004"]


def test_a_root_both_tools_saved_into_resumes_from_the_newer(tmp_path) -> None:
    """checkpoint.format=megatron_lm writes `latest` and the tracker; Megatron-LM, continuing in
    the same root, moves only its tracker."""
    root = tmp_path / "save"
    _step(root / "iter_0000002")
    _step(root / "iter_0000004")
    (root / "latest").write_text("iter_0000002")
    (root / MEGATRON_LM_TRACKER).write_text("4")
    assert newest_checkpoint(root) == root / "iter_0000004"


def _load(tmp_path: Path, load: Path, *overrides: str):
    return resolve_config(["recipe=tiny_dp1", f"checkpoint.load={load}", *overrides])


@pytest.mark.parametrize(("layout", "expected"), [
    ({"latest_checkpointed_iteration.txt": "abc"},
     "its latest_checkpointed_iteration.txt file names no step ('')"),
    ({"latest_checkpointed_iteration.txt": "10"},
     "latest_checkpointed_iteration.txt names iter_0000010, but"),
    ({"iter_0000010/mp_rank_00/model_optim_rng.pt": ""},
     "is a Megatron-LM checkpoint in the older torch format (mp_rank_* files); this project "
     "loads torch_dist: convert it with Megatron-LM's --ckpt-convert-format torch_dist"),
    ({"iter_0000010/.metadata": "", "iter_0000010/__0_0.distcp": ""},
     "is a torch DCP checkpoint without Megatron's metadata.json (Megatron-LM's torch_dcp or "
     "fsdp_dtensor format)"),
])
def test_what_is_not_a_resumable_megatron_lm_save_is_one_line(tmp_path, layout, expected) -> None:
    root = tmp_path / "save"
    for name, text in layout.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    message = check_checkpoint_load_path(_load(tmp_path, root))
    assert expected in message and "\n" not in message


def test_a_release_checkpoint_loads_weights_only(tmp_path) -> None:
    root = tmp_path / "save"
    dcp_step(root / "release")
    (root / MEGATRON_LM_TRACKER).write_text("release")
    assert check_checkpoint_load_path(_load(tmp_path, root)) is None
    with pytest.raises(ConfigError, match="^checkpoint.load=.* resumes from Megatron-LM's release "
                       "checkpoint, which holds weights only .* checkpoint.load_model_only=true$"):
        checkpoint_preflight(_load(tmp_path, root))
    assert checkpoint_preflight(_load(tmp_path, root, "checkpoint.load_model_only=true")) == []


def test_pickled_classes_become_inert_records() -> None:
    """The restricted unpickler runs no class: an object whose unpickling would call `os.system`
    is a Record of the call instead."""
    class Boom:
        def __reduce__(self):
            import os
            return os.system, ("echo pwned > /dev/null",)

    loaded = _unpickle(pickle.dumps({"args": Boom(), "iteration": 3}))
    assert loaded["iteration"] == 3 and isinstance(loaded["args"], Record)
    assert loaded["args"].args == ("echo pwned > /dev/null",)


def test_megatron_bridge_counters_are_read_without_torch(tmp_path) -> None:
    """Bridge's `train_state.pt` (a torch.save of scalar tensors, int64 now, int32 before)."""
    import torch

    path = tmp_path / "train_state.pt"
    torch.save({"step": torch.tensor(7, dtype=torch.int32),
                "consumed_train_samples": torch.tensor(56, dtype=torch.int64),
                "floating_point_operations_so_far": torch.tensor(1.5, dtype=torch.float64),
                "do_train": torch.tensor(True)}, path)
    assert _scalars(path.read_bytes()) == {"step": 7, "consumed_train_samples": 56,
                                           "floating_point_operations_so_far": 1.5,
                                           "do_train": True}


def test_the_rng_grid_comes_from_the_saved_keys() -> None:
    assert rng_grid(["model.x", "rng_state/shard_0_4"]) == (4,)  # this project's, per rank
    assert rng_grid(["rng_state/shard_0.1_2.2"]) == (2, 2)  # Megatron-LM's PP x TP
    assert rng_grid(["optimizer.y"]) is None
    assert rng_matches((2, 2), pp=2, tp=2, dp=3, world=12)
    assert not rng_matches((1, 2), pp=2, tp=1, dp=1, world=2)
    assert rng_matches((4,), pp=1, tp=1, dp=4, world=4) and not rng_matches(None, 1, 1, 1, 1)


@pytest.mark.parametrize("recipe", ["tiny_tp2_pp2", "hybrid_tiny_dp1", "mixtral_tiny_ep1"])
def test_megatron_lms_saved_arguments_read_as_the_recipe(recipe) -> None:
    """What Megatron-LM saves as `args` (its parser over the recipe's command line, with its
    filled-in KV width and query groups) reads back as the recipe's shape: nothing to refuse,
    nothing to state."""
    from recipes.config.io import config_dict
    from recipes.config.megatron_args import to_megatron_args
    from trainer.tools.megatron_args import megatron_parser

    cfg = get_recipe(recipe)
    args = vars(megatron_parser().parse_known_args(to_megatron_args(cfg))[0])
    m = cfg.model
    args.update(kv_channels=m.kv_channels or m.hidden_size // m.num_attention_heads,
                num_query_groups=m.num_query_groups or m.num_attention_heads)
    saved = flatten(config_from_args(args))
    current = flatten(config_dict(cfg))
    assert shape_mismatch(saved, current) is None and stated_changes(saved, current) == []
    m.hidden_size *= 2
    assert shape_mismatch(saved, flatten(config_dict(cfg))).startswith(
        "it was saved with model.hidden_size=")


def test_what_a_megatron_lm_step_cannot_resume_into_is_one_line() -> None:
    from trainer.checkpoint.megatron_lm import foreign_resume_problem

    cfg = get_recipe("tiny_dp1")
    assert foreign_resume_problem(cfg, {"optimizer_saved": True}) is None
    assert foreign_resume_problem(cfg, {"optimizer_saved": False}).startswith(
        "it holds no optimizer state (saved with --no-save-optim); start from its weights with "
        "checkpoint.load_model_only=true")
    phased = resolve_config(["recipe=tiny_dp1", "phases=[{name: a, end_step: 100}, "
                             "{name: b, end_step: 300}]"])
    assert foreign_resume_problem(phased, {"optimizer_saved": True}).startswith(
        "its data position is one stream of samples, and this run trains in phases")


@pytest.mark.parametrize("damage, message", [
    (lambda step: (step / ".metadata").write_bytes((step / ".metadata").read_bytes()[:40]),
     "iter_0000004/.metadata cannot be read (cut short or damaged)"),
    (lambda step: (step / "__0_0.distcp").unlink(),
     "iter_0000004/__0_0.distcp is missing (its index places data there)"),
    (lambda step: (step / "__0_0.distcp").write_bytes(b"x" * 100),
     "iter_0000004/__0_0.distcp is cut short (100 of at least "),
])
def test_a_damaged_step_without_run_json_is_one_line_before_any_rank(tmp_path, damage,
                                                                     message) -> None:
    """A step without run.json (Megatron-LM's, Megatron Bridge's) has no file records; its DCP
    index still places every byte, so a file cut short or gone is said before launch, with the
    earlier step to fall back to, not met by torch DCP in every rank as a traceback."""
    from trainer.checkpoint.megatron_lm import unchecked_damage

    root = tmp_path / "save"
    dcp_step(root / "iter_0000002")
    step = dcp_step(root / "iter_0000004")
    (root / MEGATRON_LM_TRACKER).write_text("4")
    assert unchecked_damage(step) is None
    damage(step)
    assert unchecked_damage(step).startswith(message)
    with pytest.raises(ConfigError) as caught:
        checkpoint_preflight(_load(tmp_path, root, "checkpoint.load_model_only=true"))
    assert str(caught.value).startswith(f"checkpoint.load={root}: {message}")
    assert str(caught.value).endswith(f"fall back to the previous complete checkpoint with "
                                      f"checkpoint.load={root / 'iter_0000002'} (or delete "
                                      f"{step}: the root then resumes from it)")


def test_a_steps_index_is_read_once_per_preflight_and_again_when_rewritten(tmp_path,
                                                                           monkeypatch) -> None:
    """The pre-flight asks for a step's DCP index from several checks (its damage, its
    bookkeeping); a large model's `.metadata` runs to megabytes, so it is unpickled once, and
    again only when the file changes."""
    import os

    from trainer.checkpoint import megatron_lm

    root = tmp_path / "save"
    step = dcp_step(root / "iter_0000004")
    (root / MEGATRON_LM_TRACKER).write_text("4")
    index, unpickle, reads = (step / ".metadata").read_bytes(), megatron_lm._unpickle, []
    monkeypatch.setattr(megatron_lm, "_unpickle",
                        lambda data: reads.append(data == index) or unpickle(data))
    cfg = _load(tmp_path, root, "checkpoint.load_model_only=true")
    checkpoint_preflight(cfg)
    assert reads.count(True) == 1
    checkpoint_preflight(cfg)
    assert reads.count(True) == 1
    os.utime(step / ".metadata", ns=(0, 0))  # the same bytes written again: read again
    checkpoint_preflight(cfg)
    assert reads.count(True) == 2


@pytest.mark.parametrize("content", [b"\xf1\x00 not UTF-8", b"tensor_model_parallel_size: [\n",
                                     b"- a list\n"])
def test_a_bridge_run_config_that_cannot_be_read_describes_nothing(tmp_path, content):
    """Megatron Bridge's `run_config.yaml` is read only to describe the step (its layout and
    settings for the pre-flight's checks); one that is not UTF-8, not YAML or not a mapping
    describes nothing rather than ending the launch in a traceback."""
    from trainer.checkpoint.format import BRIDGE_RUN_CONFIG
    from trainer.checkpoint.megatron_lm import _bridge_config

    (tmp_path / BRIDGE_RUN_CONFIG).write_bytes(content)
    assert _bridge_config(tmp_path) == {}
