"""Exact string replacement in a sandbox's file: the `str_replace` tool, planted bugs and candidate fixes."""

from __future__ import annotations

import posixpath
from typing import Protocol

from rollbox.errors import EditFailed


class Files(Protocol):
    async def read(self, path: str) -> bytes: ...

    async def write(self, path: str, data: str | bytes) -> None: ...


def resolve(workdir: str, path: str) -> str:
    """An absolute sandbox path: relative paths start at the task's workdir."""
    return posixpath.normpath(posixpath.join(workdir, path))


def replace_once(text: str, old: str, new: str, path: str) -> str:
    if not old:
        raise EditFailed(f"{path}: the text to replace is empty")
    count = text.count(old)
    if count == 0:
        raise EditFailed(f"{path}: the text to replace was not found")
    if count > 1:
        raise EditFailed(f"{path}: the text to replace occurs {count} times; include more context to make it unique")
    return text.replace(old, new, 1)


async def apply_edit(files: Files, path: str, old: str, new: str) -> None:
    """Replaces the one occurrence of `old` in the file at `path` (absolute) with `new`."""
    text = (await files.read(path)).decode("utf-8", errors="surrogateescape")
    await files.write(path, replace_once(text, old, new, path).encode("utf-8", errors="surrogateescape"))
