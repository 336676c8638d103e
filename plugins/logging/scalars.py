"""The scalars a logger writes, taken generically from the hooks' dataclasses (torch-free).

Every numeric field of `StepMetrics` (and every numeric property, such as `tokens_per_s`) and
every figure plugins put in `StepMetrics.extra` becomes a `train/<name>` scalar (a field that
is a dict of numbers, such as `source_tokens`, one `train/<field>/<key>` each); held-out
evaluations become `heldout/<name>`. Nothing is listed by name, so a field added to the
dataclasses later is logged without a change here: the loggers carry what metrics.jsonl carries.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

SKIPPED = ("step",)  # the x axis, not a scalar


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def numeric_fields(record: Any) -> dict[str, float]:
    """Numeric dataclass fields, numeric properties and the `extra` dict of one record."""
    values: dict[str, Any] = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    for name, attribute in vars(type(record)).items():
        if isinstance(attribute, property) and not name.startswith("_"):
            values[name] = getattr(record, name)
    extra = values.pop("extra", None) or {}
    values.update({name: value for name, value in extra.items() if name not in values})
    for name, value in list(values.items()):
        if isinstance(value, dict):
            del values[name]
            values.update({f"{name}/{key}": item for key, item in value.items()})
    numbers = {name: _number(value) for name, value in values.items() if name not in SKIPPED}
    return {name: number for name, number in numbers.items() if number is not None}


def tagged(prefix: str, record: Any) -> dict[str, float]:
    """`prefix/<name>` -> value for every numeric figure of a StepMetrics or EvalResult."""
    return {f"{prefix}/{name}": value for name, value in numeric_fields(record).items()}
