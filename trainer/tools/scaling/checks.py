"""The scaling harness's refusals of a command line before anything runs, one rule a function.

Each returns None or the one line (`error: <what>; <how to fix>`) that `scripts/scaling.py`
prints with exit code 2. Why they exist: a sweep that starts and then meets a mistake has
already trained (or submitted) the sizes before it, and an option the harness does not use
was ignored without a word, so the user believed the runs had it. The checks that need the
machine, the cluster file or a config (each size's placement) are in `sweep.py`, which runs
them for every size before the first starts; these need only the parsed arguments and paths.
No torch, no recipe resolution: a refusal stays under a second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.tools.scaling.report import MODES, check_world_sizes


def given_options(given: Collection[str], keys: Sequence[str]) -> list[str]:
    """`key=` for each of `keys` the command line typed (`Arguments.given`), at its default
    value too: typed where it does nothing, it is refused all the same."""
    return [f"{key}=" for key in keys if key in given]


def _them(names: Sequence[str]) -> tuple[str, str]:
    """(verb, pronoun) agreeing with how many options a line names."""
    return ("applies", "it") if len(names) == 1 else ("apply", "them")


def cluster_only_problem(given: Sequence[str], cluster: str | None) -> str | None:
    """The launcher's options (account=, partition=, time=, executor=, job_dir=, --dry-run, ...)
    shape each size's cluster job; without `cluster=` every size runs here, and they would be
    ignored without a word while the user believes the runs got an account or a time limit
    (or that a dry run checked the sweep while it trains every size in full)."""
    if cluster is not None or not given:
        return None
    verb, them = _them(given)
    return (f"{', '.join(given)} {verb} only to cluster jobs, but without cluster= every size "
            f"runs here and would ignore {them}; drop {them}, or add cluster=conf/cluster/"
            "<file>.yaml to submit each size as a job")


def report_only_problem(report: str | None, given: Sequence[str]) -> str | None:
    """`scaling.report=DIR` writes the report of a finished sweep from its files alone (the
    options and sizes it ran are in DIR/sweep.json): a recipe, an override, a sweep or launch
    option or `--dry-run` beside it would be ignored while the user believes the report (or a
    new sweep) follows them."""
    if report is None or not given:
        return None
    verb, them = _them(given)
    return (f"{', '.join(given)} {'does' if them == 'it' else 'do'} not apply to "
            f"scaling.report={report}, which reports the finished sweep as {report}/sweep.json "
            f"recorded it; drop {them} (to run a new sweep, leave scaling.report out)")


def rest_names(rest: Sequence[str]) -> list[str]:
    """`recipe=`, `train.global_batch_size=`: the names of the recipe and overrides given."""
    return [f"{arg.split('=', 1)[0]}=" for arg in rest]


def inapplicable_problem(values: Mapping[str, Any], given: Collection[str],
                         flags: Collection[str], rest: Sequence[str]) -> str | None:
    """Options given where they do nothing: anything beside `scaling.report=`, or the
    launcher's options without `cluster=` (SCALING's parsed `values`, every option filled in,
    and the options the user typed, `given`)."""
    launch = [key for key in values if not key.startswith("scaling.") and key != "cluster"]
    flags_given = sorted(flags)  # SCALING's flags are the launcher's (--dry-run)
    if values.get("scaling.report") is not None:
        sweep = [key for key in values if key.startswith("scaling.") and key != "scaling.report"]
        named = [*rest_names(rest), *given_options(given, [*sweep, "cluster", *launch]),
                 *flags_given]
        return report_only_problem(values["scaling.report"], named)
    return cluster_only_problem([*given_options(given, launch), *flags_given],
                                values.get("cluster"))


def out_problem(out: str | None, output_dir: str) -> str | None:
    """The sweep directory can be created and written, tried before the first size starts
    (the path rules' own test, which leaves nothing behind): otherwise an existing file or an
    unwritable place (`/proc/x`) ends in `mkdir`'s traceback. `scaling.out` when given, else
    the `output_dir` the default sweep directory goes under."""
    from recipes.config.path_rules import directory_problem

    if out is not None:
        return directory_problem("scaling.out", out, "give scaling.out a writable directory, "
                                 "e.g. scaling.out=runs/scaling-<name>")
    return directory_problem("output_dir", output_dir, "set output_dir to a writable "
                             "directory, or give scaling.out=DIR")


SWEEP_KEYS = ("options", "points", "model_state_gib")


def sweep_problem(sweep: Any, option_names: Collection[str],
                  point_names: Collection[str]) -> str | None:
    """What makes a parsed sweep.json unusable, in words (None: usable): a damaged or
    hand-edited file would otherwise end in a KeyError or TypeError while the report is
    built. `option_names`, `point_names`: the fields of ScalingOptions and Point."""
    if not isinstance(sweep, dict):
        return "holds no JSON object"
    missing = [key for key in SWEEP_KEYS if key not in sweep]
    if missing:
        return f"has no {missing[0]!r} key"
    options, points, states = (sweep[key] for key in SWEEP_KEYS)
    if not isinstance(options, dict) or not set(options) <= set(option_names):
        return "has 'options' that are not the scaling.* options"
    if not isinstance(points, list) or not points or not all(
            isinstance(point, dict) and set(point) == set(point_names) for point in points):
        return f"has 'points' that do not each hold {', '.join(point_names)}"
    if not isinstance(states, list) or len(states) != len(points):
        return f"has 'model_state_gib' without one figure for each of its {len(points)} points"
    return option_values_problem(options) or point_values_problem(points, states)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def option_values_problem(options: Mapping[str, Any]) -> str | None:
    """The first recorded option whose value a sweep never writes (a hand-edited file), in
    words; None when each is of its kind."""
    sizes = options.get("world_sizes", [1])
    if not isinstance(sizes, list) or not all(map(_count, sizes)) or check_world_sizes(
            "world_sizes", sizes):
        return f"has options.world_sizes={sizes!r}, not a list of rank counts"
    if options.get("mode", MODES[0]) not in MODES:
        return (f"has options.mode={options['mode']!r}, neither "
                f"{' nor '.join(repr(mode) for mode in MODES)}")
    if not _count(options.get("steps", 1)):
        return f"has options.steps={options['steps']!r}, not a count of steps"
    budget = options.get("token_budget", 1.0)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        return f"has options.token_budget={budget!r}, not a positive number of tokens"
    for key in ("cluster", "out", "report"):
        if not isinstance(options.get(key), (str, type(None))):
            return f"has options.{key}={options[key]!r}, neither a path nor null"
    return None


def point_values_problem(points: Sequence[Mapping[str, Any]], states: Sequence[Any]
                         ) -> str | None:
    """The first recorded point or model-state figure of the wrong kind, in words."""
    for point in points:
        for key in ("gpus", "data_parallel", "global_batch", "microbatches"):
            if not _count(point[key]):
                return f"has a point with {key}={point[key]!r}, not a count"
        if not isinstance(point["overrides"], list) or not all(
                isinstance(text, str) for text in point["overrides"]):
            return f"has a point with overrides={point['overrides']!r}, not a list of overrides"
    for state in states:
        if isinstance(state, bool) or not isinstance(state, (int, float)):
            return f"has model_state_gib figure {state!r}, not a number"
    return None


def field_names(cls: type) -> list[str]:
    """A dataclass's field names (the keys `dataclasses.asdict` writes)."""
    return [f.name for f in dataclasses.fields(cls)]


def damaged_sweep_line(report: str | Path, path: Path, what: str) -> str:
    """The one line for a sweep.json the report cannot read: the file and what is wrong."""
    return (f"scaling.report={report}: {path} {what}, so it is not a sweep this tool wrote (or "
            "it was damaged); name the directory a scaling sweep wrote (it prints it when it "
            "starts), or run the sweep again")


def size_line(gpus: int, line: str) -> str:
    """A size's refusal, said before the first size starts: which size, the check's own line,
    and that leaving the size out is a fix too."""
    return f"scaling.world_sizes has {gpus}: {line}; or drop {gpus} from scaling.world_sizes"
