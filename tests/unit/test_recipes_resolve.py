"""argv -> validated RunConfig: recipe=NAME, config=FILE, overrides, and the recipe list."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugins.protocol.errors import ConfigError
from recipes.config.io import save_config
from recipes.registry import DEFAULT_RECIPE, get_recipe
from recipes.resolve import ListRecipesRequested, parse_args, resolve_config
from trainer.checkpoint.preflight import validate_paths

REPO = Path(__file__).resolve().parents[2]


def test_no_arguments_gives_the_default_recipe() -> None:
    assert resolve_config([]) == get_recipe(DEFAULT_RECIPE)


def test_alias_and_overrides_resolve_to_the_named_recipe() -> None:
    cfg = resolve_config(["recipe=8b_tp8_pp4_dp2", "train.micro_batch_size=1", "optimizer.lr=2e-4"])
    assert cfg.name == "llama3_8b_tp8_pp4_dp2"
    assert cfg.train.micro_batch_size == 1
    assert cfg.optimizer.lr == pytest.approx(2e-4)


@pytest.mark.parametrize("argv", [["recipe=list"], ["train.seed=1", "recipe=list"]])
def test_list_and_help_ask_for_the_recipe_list(argv: list[str]) -> None:
    with pytest.raises(ListRecipesRequested):
        resolve_config(argv)


def test_config_file_reproduces_the_run(tmp_path) -> None:
    cfg = resolve_config(["recipe=tiny_pp2_vpp2", "train.train_iters=20", "optimizer.lr=1e-3"])
    path = save_config(cfg, tmp_path / "config.yaml")
    assert resolve_config([f"config={path}"]) == cfg
    again = resolve_config([f"config={path}", "train.train_iters=30"])
    assert again.train.train_iters == 30 and again.optimizer.lr == pytest.approx(1e-3)


def test_validation_runs_after_overrides() -> None:
    with pytest.raises(ConfigError, match=r"^train.global_batch_size=6 is not divisible"):
        resolve_config(["recipe=tiny_dp2", "train.global_batch_size=6"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["recipe=tiny_dp1", "config=x.yaml"], "give either recipe=tiny_dp1 or config=x.yaml"),
        (["recipe=tiny_dp1", "recipe=tiny_dp2"], "recipe= given twice (tiny_dp1, tiny_dp2)"),
        (["recipe=tiny_dp3"], "unknown recipe 'tiny_dp3'; did you mean tiny_dp2, tiny_dp1"),
        (["tiny_dp1"], "'tiny_dp1' is not an override; write KEY=VALUE"),
    ],
)
def test_command_line_mistakes(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config(argv)
    assert message in str(caught.value)


def test_parse_args_keeps_override_order() -> None:
    parsed = parse_args(["a.b=1", "recipe=tiny_dp1", "c.d=2", "a.b=3"])
    assert parsed.recipe == "tiny_dp1" and parsed.config is None
    assert parsed.overrides == ["a.b=1", "c.d=2", "a.b=3"]


def test_resolving_imports_neither_torch_nor_megatron() -> None:
    # The wrong-machine error must come before heavy imports: it is the import of torch and
    # Megatron Core, not resolution, that takes seconds (a wall-clock bound would measure the
    # machine's load instead).
    code = (
        "import sys\n"
        "from recipes.resolve import resolve_config\n"
        "from recipes.config.machine import check_machine, detect_machine\n"
        "cfg = resolve_config(['recipe=8b_tp8_pp4_dp2', 'data.source=synthetic'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron'))\n"
        "print(heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def _finished_checkpoint(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    return path


def _resolved_and_checked(argv: list[str]):
    """As the entry pipeline does: resolve (reads no paths), then the trainer's path checks."""
    cfg = resolve_config(argv)
    validate_paths(cfg)
    return cfg


def test_checkpoint_paths_that_hold_a_checkpoint_resolve(tmp_path) -> None:
    root = tmp_path / "run" / "checkpoints"
    step = _finished_checkpoint(root / "step_0000300")
    (root / "latest").write_text("step_0000300")
    weights = _finished_checkpoint(tmp_path / "weights")
    for load in (root, step, weights):
        cfg = _resolved_and_checked([f"checkpoint.load={load}", f"output_dir={tmp_path / 'out'}"])
        assert cfg.checkpoint.load == str(load)


def test_resolving_reads_no_paths_and_the_path_checks_skip_a_dry_run(tmp_path) -> None:
    missing = tmp_path / "missing"
    assert resolve_config([f"checkpoint.load={missing}"]).checkpoint.load == str(missing)
    with pytest.raises(ConfigError, match=r"^checkpoint\.load=.*/missing does not exist"):
        _resolved_and_checked([f"checkpoint.load={missing}"])
    with pytest.raises(ConfigError, match=r"^train.global_batch_size=6 is not divisible"):
        _resolved_and_checked(
            ["recipe=tiny_dp2", "train.global_batch_size=6", f"checkpoint.load={missing}"]
        )
    cfg = _resolved_and_checked(["dry_run=true", f"checkpoint.load={missing}"])  # reads no files
    assert cfg.checkpoint.load == str(missing)
