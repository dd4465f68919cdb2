"""Quantities as resources and requests write them: sizes (`512Mi`), CPU (`500m`) and durations (`5m`), parsed
once and described once for the OpenAPI schema."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema

_BINARY_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                 "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
MAX_BYTES = 2**63 - 1
"""The largest size: what the kernel's 64-bit counters (a cgroup's limit, a file's size) hold."""
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|K|M|G|T|)\s*$")
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|)\s*$")
_DURATION_UNITS = {"ms": 0.001, "": 1, "s": 1, "m": 60, "h": 3600}


def parse_bytes(value: Any) -> int:
    """Turns `512Mi`, `1G` or a plain number into bytes (a number past a float's range is refused here, as in
    `parse_seconds`)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512Mi or 1Gi")
    if isinstance(value, int | float):
        size = value
    else:
        match = _QUANTITY.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a size: use a number with an optional unit (Ki, Mi, Gi)")
        size = float(match.group(1)) * _BINARY_UNITS[match.group(2)]
    if not -MAX_BYTES <= size <= MAX_BYTES:  # an infinity and a NaN too
        raise ValueError("a size must be a number of bytes under 2**63 (a kernel's counters hold no more)")
    return int(size)


def parse_cpu(value: Any) -> float:
    """Turns `2`, `0.5` or `500m` (millicores) into cores."""
    text = str(value).strip()
    try:
        cores = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a CPU amount: use cores (1, 0.5) or millicores (500m)") from None
    if not 0 < cores < math.inf:
        raise ValueError("cpu must be a positive, finite number of cores")
    return cores


def parse_seconds(value: Any) -> float:
    """Turns `30s`, `5m`, `250ms` or a plain number of seconds into seconds. A number past a float's range is
    refused here: let through, it overflowed (a 500) or became an infinity wherever it was next used."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number, unit = value, ""
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration: use seconds or a unit (ms, s, m, h)")
        number, unit = match.group(1), match.group(2)
    try:
        seconds = float(number) * _DURATION_UNITS[unit]
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError("a duration must be a finite number of seconds")
    return seconds


def number_or_unit(number: dict[str, Any], units: re.Pattern[str] = _DURATION) -> WithJsonSchema:
    """The JSON schema of a quantity given as a number (its bound in JSON Schema's words) or as text with a unit
    (`5m`, `1Gi`): left to pydantic, the bound reads `gt`, which JSON Schema does not know, and text is missing."""
    return WithJsonSchema({"anyOf": [number, {"type": "string", "pattern": units.pattern}]})


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(gt=0),
                  number_or_unit({"type": "integer", "exclusiveMinimum": 0}, _QUANTITY)]
Cores = Annotated[float, BeforeValidator(parse_cpu)]
Seconds = Annotated[float, BeforeValidator(parse_seconds), Field(ge=0),
                    number_or_unit({"type": "number", "minimum": 0})]
