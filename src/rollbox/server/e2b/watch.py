"""Directory watchers for E2B's `files.watch_dir`, by looking: a listing now against the listing at the last look.

The sync SDK creates a watcher and polls it for events (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`);
the async one holds a stream open (`WatchDir`), which looks every LOOK_EVERY seconds. A file made and removed
between two looks is not seen, and a write shows as a file's size or modification time changing. Watchers live in
the router that made them, at most MAX_WATCHERS (the oldest go first), so a router replica answers only for
its own.
"""

from __future__ import annotations

import asyncio
import posixpath
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rollbox.errors import InvalidRequest, NotFound
from rollbox.models import FileInfo

LOOK_EVERY = 0.25
MAX_WATCHERS = 1000
MAX_ENTRIES = 10_000
"""Entries one look reads at most (a recursive watch of a large tree is refused past it)."""
CREATE, WRITE, REMOVE = 1, 2, 3
Listing = dict[str, FileInfo]
List = Callable[[str], Coroutine[Any, Any, list[FileInfo]]]


@dataclass
class Watcher:
    owner: tuple[str, str]
    """The tenant and sandbox it watches for."""
    path: str
    recursive: bool
    seen: Listing


async def look(list_dir: List, path: str, recursive: bool) -> Listing:
    """Every entry under `path` (one level, or all with `recursive`), by its path relative to `path`."""
    found: Listing = {}
    pending = [path]
    while pending:
        directory = pending.pop()
        for info in await list_dir(directory):
            found[posixpath.relpath(info.path, path)] = info
            if len(found) > MAX_ENTRIES:
                raise InvalidRequest(f"{path} holds more than {MAX_ENTRIES} entries: watch a smaller directory")
            if recursive and info.type == "dir":
                pending.append(info.path)
    return found


def changes(before: Listing, after: Listing) -> list[tuple[str, int, FileInfo | None]]:
    """(name, event type, entry) for what appeared, changed and went between two looks."""
    found: list[tuple[str, int, FileInfo | None]] = []
    for name, info in after.items():
        old = before.get(name)
        if old is None:
            found.append((name, CREATE, info))
        elif info.type != "dir" and (old.size, old.mtime, old.type) != (info.size, info.mtime, info.type):
            found.append((name, WRITE, info))
    found.extend((name, REMOVE, None) for name in before.keys() - after.keys())
    return found


class Watchers:
    def __init__(self) -> None:
        self._watchers: OrderedDict[str, Watcher] = OrderedDict()

    async def create(self, owner: tuple[str, str], list_dir: List, path: str, recursive: bool) -> str:
        seen = await look(list_dir, path, recursive)
        watcher_id = secrets.token_hex(8)
        self._watchers[watcher_id] = Watcher(owner, path, recursive, seen)
        while len(self._watchers) > MAX_WATCHERS:
            self._watchers.popitem(last=False)
        return watcher_id

    async def events(self, owner: tuple[str, str], list_dir: List, watcher_id: str
                     ) -> list[tuple[str, int, FileInfo | None]]:
        watcher = self._get(owner, watcher_id)
        now = await look(list_dir, watcher.path, watcher.recursive)
        found, watcher.seen = changes(watcher.seen, now), now
        return found

    def remove(self, owner: tuple[str, str], watcher_id: str) -> None:
        self._get(owner, watcher_id)
        del self._watchers[watcher_id]

    def _get(self, owner: tuple[str, str], watcher_id: str) -> Watcher:
        watcher = self._watchers.get(watcher_id)
        if watcher is None or watcher.owner != owner:
            raise NotFound(f"watcher {watcher_id!r} does not exist (removed, or made by another router)")
        return watcher


async def follow(list_dir: List, path: str, recursive: bool) -> AsyncIterator[list[tuple[str, int, FileInfo | None]]]:
    """What changes under `path`, look after look, for as long as it is followed (the first look yields [])."""
    seen = await look(list_dir, path, recursive)
    yield []
    while True:
        await asyncio.sleep(LOOK_EVERY)
        now = await look(list_dir, path, recursive)
        found, seen = changes(seen, now), now
        if found:
            yield found
