"""A pydantic validation error as one line that says which fields are wrong: a bad request body, template, task file,
tool call or SDK argument.

It sits on the ground floor, importing nothing of rollbox, so that every layer words its problems the same way.
"""

from __future__ import annotations

import itertools

from pydantic import ValidationError

TOLD = 20
"""The problems named: one of thousands of unknown keys is told in a few."""


def problems(error: ValidationError, whole: str = "value") -> str:
    """The first problems, each as `field.path: message` (`whole` names the input itself), and how many more."""
    count = error.error_count()
    if count <= TOLD:
        return "; ".join(f"{'.'.join(str(part) for part in item['loc']) or whole}: {item['msg']}"
                         for item in error.errors(include_url=False, include_context=False, include_input=False))
    # Thousands (an object of unknown keys): as Python objects they would cost many times the input, and leave the
    # allocator's arenas scattered after; pydantic's text of them is one string, of which the start is enough.
    told, lines = [], str(error)[:64 * TOLD * 8].splitlines()[1:]
    for where, message in itertools.pairwise(lines):
        if not where.startswith(" ") and message.startswith("  ") and not message.startswith("   "):
            told.append(f"{where or whole}: {message.strip().rsplit(' [type=', 1)[0]}")
    return "; ".join(told[:TOLD]) + f"; and {count - min(len(told), TOLD)} more"
