"""Users as a sandbox sees them: resolved from the `/etc/passwd` and `/etc/group` of its layers."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollbox.engine.descriptors import openat2
from rollbox.errors import InvalidRequest

_MAX_TABLE = 16 * 2**20


@dataclass(frozen=True)
class Account:
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    name: str


def read_in_layers(roots: Sequence[Path], relative: str) -> str | None:
    """The topmost root's copy of a file (roots are given top first), or None.

    Each lookup stays inside its root (openat2 RESOLVE_IN_ROOT): a sandbox whose root replaced
    `/etc` with a link to the host's must not make the host read its own files.
    """
    for root in roots:
        try:
            root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fd = openat2(root_fd, relative, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        finally:
            os.close(root_fd)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):  # not a directory, a device or a FIFO put in its place
                with os.fdopen(fd, "rb", closefd=False) as handle:
                    return handle.read(_MAX_TABLE).decode(errors="replace")
        finally:
            os.close(fd)
    return None


def _table(roots: Sequence[Path], name: str) -> list[list[str]]:
    text = read_in_layers(roots, f"etc/{name}")
    if text is None:
        return []
    return [line.split(":") for line in text.splitlines()
            if line and not line.startswith("#") and line.count(":") >= 3]


def resolve(roots: Sequence[Path], user: str) -> Account:
    """Resolves `name`, `uid` or `uid:gid` the way the sandbox's own /etc would (roots top first)."""
    passwd = _table(roots, "passwd")
    groups = _table(roots, "group")
    name, _, group = user.partition(":")
    entry = next((row for row in passwd if row[0] == name or (name.isdigit() and row[2] == name)), None)
    if entry is None and name == "root":
        name = "0"  # root is uid 0 even where /etc/passwd is gone (after an `rm -rf /`, say)
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
