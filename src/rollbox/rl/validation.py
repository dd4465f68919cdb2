"""One line per validation problem, so a bad task file or tool call says which field is wrong."""

from __future__ import annotations

from pydantic import ValidationError


def describe(error: ValidationError, subject: str = "value") -> str:
    return "; ".join(f"{'.'.join(str(part) for part in item['loc']) or subject}: {item['msg']}"
                     for item in error.errors())
