"""Save a resolved configuration as YAML and load it back (`config=<file>` reproduces a run)."""

from __future__ import annotations

import typing
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from plugins.protocol.errors import ConfigError
from recipes.config.overrides import carry_retired_keys, merge_checked, to_run_config
from recipes.config.schema import RunConfig
from recipes.config.yaml_file import scalar_texts, unreadable_value

CONFIG_FILENAME = "config.yaml"  # name of the resolved config inside a run directory


def config_to_yaml(cfg: RunConfig) -> str:
    """The YAML text of a configuration (every field, defaults included)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_dict(cfg: RunConfig) -> dict:
    """The configuration as plain nested dicts (every field, defaults included): JSON-ready."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)


def resolved_yaml(cfg: RunConfig) -> str:
    """What `print=config` prints: a header naming the recipe, then every field as YAML (the
    text `save_config` writes, which `config=FILE` reads back)."""
    return f"# Resolved configuration of recipe '{cfg.name}'.\n" + config_to_yaml(cfg)


def save_config(cfg: RunConfig, path: str | Path) -> Path:
    """Write `cfg` as YAML to `path` (parents created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Resolved configuration of recipe '{cfg.name}'.\n"
        f"# Reproduce the run with: python scripts/pretrain.py config={path}\n"
    )
    path.write_text(header + config_to_yaml(cfg), encoding="utf-8")
    return path


def _check_config_path(path: Path, origin: str) -> None:
    """`config=` names an existing file; a run directory means the config.yaml inside it."""
    if path.is_dir():
        inside = path / CONFIG_FILENAME
        hint = f"config={inside}" if inside.is_file() else f"config=runs/<run>/{CONFIG_FILENAME}"
        raise ConfigError(f"{origin} is a directory, not a file; pass the file, e.g. {hint}")
    if not path.is_file():
        raise ConfigError(
            f"{origin} does not exist; pass a saved config, "
            f"e.g. config=runs/<run>/{CONFIG_FILENAME}"
        )


def load_config(path: str | Path) -> RunConfig:
    """Read a YAML file written by `save_config` back into a `RunConfig`.

    Keys missing from the file take the schema defaults; unknown keys and wrong types are
    one-line `ConfigError`s naming the file. Keys an older version saved that were removed or
    moved since (`retired_keys()`) are carried over: a moved key's value goes to its new place, a
    switch the config now implies is dropped.
    """
    if not str(path).strip():
        raise ConfigError(
            f"config= is empty; give it a saved config, e.g. config=runs/<run>/{CONFIG_FILENAME}"
        )
    path = Path(path)
    origin = f"config file {path}"
    _check_config_path(path, origin)
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        duplicate = _duplicate_key(err)
        if duplicate is not None:  # as a hand-written cluster file's is said (yaml_file.py)
            where = f" ({line.strip().removeprefix('at ')})" if line else ""
            raise ConfigError(f"{origin}: key '{duplicate}' is given twice{where}; keep one"
                              ) from None
        raise ConfigError(f"{origin} is not valid YAML{line}; fix or re-save it") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{origin} is not UTF-8 text; pass the config.yaml of a run") from None
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(f"{origin} cannot be read ({reason}); fix its permissions") from None
    except ValueError as err:  # a plain value YAML cannot convert (UnicodeDecodeError above)
        raise ConfigError(f"{origin}: {unreadable_value(err)}") from None
    if not isinstance(loaded, DictConfig):
        kind = "a list" if isinstance(loaded, ListConfig) else "a single value"
        raise ConfigError(f"{origin} must hold a mapping of config sections, not {kind}")
    if not loaded:
        raise ConfigError(
            f"{origin} is empty; pass a saved config with its sections (model:, train:, ...), "
            f"e.g. config=runs/<run>/{CONFIG_FILENAME}"
        )
    problem = cluster_file_problem(list(loaded.keys()), origin, path)
    if problem:
        raise ConfigError(problem)
    loaded = carry_retired_keys(loaded)
    base = typing.cast(DictConfig, OmegaConf.structured(RunConfig))
    merged = merge_checked(base, loaded, origin, typed=lambda: _file_texts(path),
                           label="default")
    return to_run_config(merged, origin)


def cluster_file_problem(keys: list, origin: str, path: Path) -> str | None:
    """A cluster file (`conf/cluster/*.yaml`) given as `config=`: its keys (`nodes`,
    `gpus_per_node`, ...) would each be refused as an unknown config key with a guess at a
    `cluster.` field, where the fix is to pass the file as `cluster=`. None for anything else
    (a run config has its sections: model:, train:, ...)."""
    import dataclasses

    from recipes.config.schema import ClusterConfig

    # A cluster file's machine keys are the run's `cluster:` section's (nodes, gpus_per_node).
    sections = {f.name for f in dataclasses.fields(RunConfig)} - {"name"}
    cluster_keys = {f.name for f in dataclasses.fields(ClusterConfig)} - sections - {"name"}
    if sections.intersection(keys) or not cluster_keys.intersection(keys):
        return None
    return (f"{origin} is a cluster file (nodes:, gpus_per_node:, peak_tflops:), not a run "
            f"config; pass it as cluster={path} (plan.py, launch.py) and name the run with "
            f"recipe=NAME or a saved config=runs/<run>/{CONFIG_FILENAME}")


def _duplicate_key(error: yaml.YAMLError) -> str | None:
    """The key OmegaConf's YAML loader found twice in one mapping (its ConstructorError says
    'found duplicate key <key>'), else None."""
    problem = str(getattr(error, "problem", "") or "")
    prefix = "found duplicate key "
    return problem.removeprefix(prefix) if problem.startswith(prefix) else None


def _file_texts(path: Path) -> dict[str, str]:
    """The file's scalars as written, for its errors; empty where it no longer reads."""
    try:
        return scalar_texts(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return {}
