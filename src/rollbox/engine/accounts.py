"""Users as a sandbox sees them: resolved from the `/etc/passwd` and `/etc/group` of its layers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollbox.errors import InvalidRequest


@dataclass(frozen=True)
class Account:
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    name: str


def find_in_layers(layers: Sequence[Path], relative: str) -> Path | None:
    """The topmost layer's copy of a file (layers are given top first)."""
    for layer in layers:
        candidate = layer / relative
        if candidate.is_file() and not candidate.is_symlink():
            return candidate
    return None


def _table(layers: Sequence[Path], name: str) -> list[list[str]]:
    path = find_in_layers(layers, f"etc/{name}")
    if path is None:
        return []
    return [line.split(":") for line in path.read_text(errors="replace").splitlines()
            if line and not line.startswith("#") and line.count(":") >= 3]


def resolve(layers: Sequence[Path], user: str) -> Account:
    """Resolves `name`, `uid` or `uid:gid` the way the sandbox's own /etc would."""
    passwd = _table(layers, "passwd")
    groups = _table(layers, "group")
    name, _, group = user.partition(":")
    entry = next((row for row in passwd if row[0] == name or (name.isdigit() and row[2] == name)), None)
    if entry is None and not name.isdigit():
        raise InvalidRequest(f"user {name!r} does not exist in the sandbox's /etc/passwd; use a uid or add the user")
    uid = int(entry[2]) if entry else int(name)
    gid = int(entry[3]) if entry else uid
    if group:
        row = next((g for g in groups if g[0] == group or g[2] == group), None)
        if row is None and not group.isdigit():
            raise InvalidRequest(f"group {group!r} does not exist in the sandbox's /etc/group")
        gid = int(row[2]) if row else int(group)
    login = entry[0] if entry else name
    extra = tuple(sorted({int(g[2]) for g in groups if len(g) > 3 and login in g[3].split(",")} - {gid}))
    home = entry[5] if entry and len(entry) > 5 and entry[5] else ("/root" if uid == 0 else "/tmp")
    return Account(uid, gid, extra, home, login)
