"""metrics.jsonl read back, every line checked: what `scripts/compare_runs.py` and the logging
plugin's end-of-run picture draw from, and what a resume continues (`trainer/metrics.py`); here,
below both, as the loop writes the file and plugins read it.

A run writes one JSON object a line; a file edited, copied in part or damaged on disk must not
end in a traceback where a picture was asked for. Damage is one line naming the file and line:
a line that is not a UTF-8 JSON object, a train or held-out record whose step is not a whole
number or whose loss (or lr) is not a number. A NaN or infinite loss (what a run with
`train.exit_on_nonfinite=false` writes when it diverges) is a number: it is kept, and the
picture leaves it out. A last line cut short without its newline (a run killed mid-write) is
skipped with a note.
"""

from __future__ import annotations

import json
from pathlib import Path

from plugins.protocol.errors import ConfigError

METRICS_FILE = "metrics.jsonl"  # in a run directory: one JSON record a line
PASS_RUNS = "pass run directories written by scripts/pretrain.py"
PLOTTED_KINDS = ("train", "heldout")
JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "true/false",
              type(None): "null"}


def parse_metrics(path: Path, data: bytes, fix: str = PASS_RUNS) -> tuple[list[dict], str | None]:
    """The records of a metrics.jsonl's bytes, and the note when its last line was cut short
    and skipped; a damaged line is a ConfigError naming `path:line` and ending with `fix`."""
    lines, note = record_lines(path, data, fix)
    return [record for _, record in lines], note


def record_lines(path: Path, data: bytes, fix: str) -> tuple[list[tuple[bytes, dict]], str | None]:
    """Each whole line of a metrics.jsonl's bytes with its record (a resume keeps the lines as
    written), and the note when the last line was cut short and skipped; a damaged line is a
    ConfigError naming `path:line` and ending with `fix`."""
    lines = data.split(b"\n")
    whole = lines[-1] == b""  # the file ends with its newline
    if whole:
        lines.pop()
    found, note = [], None
    for number, raw in enumerate(lines, start=1):
        try:
            value = parse_line(raw)
        except ValueError as error:
            if is_cut_short(number, len(lines), whole):
                note = (f"note: {path}: its last line is cut short (a run stopped "
                        "mid-write); compared without it")
                continue
            raise ConfigError(f"{path}:{number} is not a metrics record ({error}); {fix}") from None
        problem = record_problem(value)
        if problem:
            raise ConfigError(f"{path}:{number} is not a metrics record ({problem}); {fix}")
        found.append((raw, value))
    return found, note


def parse_line(raw: bytes) -> object:
    """One line's JSON value; ValueError (the reason) when it is not UTF-8 JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text: byte {raw[error.start]:#04x} at column "
                         f"{error.start + 1}") from None
    return json.loads(text)  # json.JSONDecodeError is a ValueError


def is_cut_short(number: int, count: int, whole: bool) -> bool:
    """Whether line `number` of `count` is what a write stopped midway leaves: the last line of
    a file that does not end with a newline."""
    return number == count and not whole


def record_problem(value: object) -> str | None:
    """What makes a parsed line no metrics record, or None; only train and held-out records are
    drawn, so only their figures are checked."""
    if not isinstance(value, dict):
        return f"a JSON {JSON_TYPES.get(type(value), 'value')}, not an object"
    if value.get("kind") not in PLOTTED_KINDS:
        return None
    figures = ("loss", "lr") if value["kind"] == "train" else ("loss",)
    problems = (step_problem(value), *(number_problem(value, name) for name in figures),
                phase_name_problem(value), tokens_problem(value))
    return next(filter(None, problems), None)


def step_problem(record: dict) -> str | None:
    """A record's step must be a whole number, 0 or more."""
    if "step" not in record:
        return "no step"
    step = record["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step is {shown(step)}, not a whole number 0 or more"
    return None


def number_problem(record: dict, name: str) -> str | None:
    """A record's figure `name` must be a number; NaN and infinity are numbers (a diverged run
    writes them) and are left out of the curve."""
    if name not in record:
        return f"no {name}"
    figure = record[name]
    if isinstance(figure, bool) or not isinstance(figure, (int, float)):
        return f"{name} is {shown(figure)}, not a number"
    return None


def phase_name_problem(record: dict) -> str | None:
    """A train record's phase_name, where it has one, is text (it names a phase boundary)."""
    name = record.get("phase_name")
    if name is not None and not isinstance(name, str):
        return f"phase_name is {shown(name)}, not text"
    return None


def tokens_problem(record: dict) -> str | None:
    """A train record's source_tokens, where it has one, maps each source to its whole number
    of tokens so far, not all 0 (the shares are those counts over their sum)."""
    tokens = record.get("source_tokens")
    if tokens is None:
        return None
    counts = list(tokens.values()) if isinstance(tokens, dict) else [None]
    whole = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts)
    if not whole or (counts and not sum(counts)):
        return (f"source_tokens is {shown(tokens)}, not a map of sources to token "
                "counts")
    return None


def shown(value: object, width: int = 40) -> str:
    """A JSON value as the file holds it, cut to `width` characters for a one-line message."""
    text = json.dumps(value)
    return text if len(text) <= width else f"{text[:width - 3]}..."
