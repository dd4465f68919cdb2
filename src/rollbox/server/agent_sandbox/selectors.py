"""Kubernetes label and field selectors (`app=web,tier!=db,env in (a,b),!legacy`), as list and watch take them."""

from __future__ import annotations

import re
from collections.abc import Callable

from rollbox.errors import InvalidRequest

Requirement = Callable[[dict[str, str]], bool]

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQUAL = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")
FIELDS = ("metadata.name", "metadata.namespace")
"""The fields a field selector may name (those every object has, as in Kubernetes for custom resources)."""


def parse(selector: str | None, what: str = "labelSelector") -> Callable[[dict[str, str]], bool]:
    """A predicate over a mapping (an object's labels, or its fields): true when every requirement holds."""
    requirements = [_requirement(part, what) for part in _split(selector or "")]
    return lambda values: all(requirement(values) for requirement in requirements)


def parse_fields(selector: str | None) -> Callable[[dict[str, str]], bool]:
    predicate = parse(selector, "fieldSelector")
    for part in _split(selector or ""):
        key = re.split(r"[!=]", part.strip(), maxsplit=1)[0].strip()
        if key not in FIELDS:
            raise InvalidRequest(f'fieldSelector: "{key}" is not a known field: use {" or ".join(FIELDS)}')
    return predicate


def equal_to(selector: str | None, key: str) -> str | None:
    """The value the selector requires `key` to equal, if it does (lets a watch on one name skip a full list)."""
    for part in _split(selector or ""):
        match = _EQUAL.match(part)
        if match and match.group(1) == key and match.group(2) != "!=":
            return match.group(3)
    return None


def _split(selector: str) -> list[str]:
    """Splits on the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(selector[start:index])
            start = index + 1
    parts.append(selector[start:])
    return [part for part in parts if part.strip()]


def _requirement(part: str, what: str) -> Requirement:
    if match := _SET.match(part):
        key, operator, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQUAL.match(part):
        key, operator, value = match.groups()
        if operator == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS.match(part):
        negated, key = match.group(1) == "!", match.group(2)
        return lambda labels: (key in labels) != negated
    raise InvalidRequest(f"{what}: cannot parse {part.strip()!r}: use key=value, key!=value, key in (a,b), "
                         "key notin (a,b), key or !key, separated by commas")
