"""Directory watchers for E2B's `files.watch_dir`: what the files API itself does is told as E2B's daemon tells it,
and what anything else does is found by looking.

The sync SDK creates a watcher and polls it for events (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`);
the async one holds a stream open (`WatchDir`). A file the files API writes, a directory it makes, what it removes or
moves is told at once, with the events inotify gives E2B's daemon for the same work (a new file: CREATE, WRITE and
CHMOD, as its owner is set). Changes made by the sandbox's own processes are found by comparing a listing with the
last one: the stream looks every LOOK_EVERY seconds, a polled watcher at each poll. A file made and removed between
two looks is not seen, and a write shows as a file's size or modification time changing. Watchers live in the
router that made them, at most MAX_WATCHERS (the oldest go first), and see the files API's calls through that
router only.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from rollbox.errors import InvalidRequest, NotFound
from rollbox.models import FileInfo

LOOK_EVERY = 0.25
MAX_WATCHERS = 1000
MAX_ENTRIES = 10_000
"""Entries one look reads at most (a recursive watch of a large tree is refused past it)."""
CREATE, WRITE, REMOVE, RENAME, CHMOD = 1, 2, 3, 4, 5
Listing = dict[str, FileInfo]
List = Callable[[str], Coroutine[Any, Any, list[FileInfo]]]
Event = tuple[str, int, FileInfo | None]
Owner = tuple[str, str]


@dataclass
class Watcher:
    owner: Owner
    """The tenant and sandbox it watches for."""
    path: str
    recursive: bool
    seen: Listing
    pending: list[Event] = field(default_factory=list)
    """Events the files API's own calls made, not yet told."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def name(self, path: str) -> str | None:
        """`path` relative to the watched directory, if the watch covers it."""
        if not path.startswith(self.path.rstrip("/") + "/"):
            return None
        name = posixpath.relpath(path, self.path)
        return name if self.recursive or "/" not in name else None


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


def changes(before: Listing, after: Listing) -> list[Event]:
    """(name, event type, entry) for what appeared, changed and went between two looks."""
    found: list[Event] = []
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

    async def create(self, owner: Owner, list_dir: List, path: str, recursive: bool) -> str:
        watcher_id = secrets.token_hex(8)
        self._watchers[watcher_id] = Watcher(owner, path, recursive, await look(list_dir, path, recursive))
        while len(self._watchers) > MAX_WATCHERS:
            self._watchers.popitem(last=False)
        return watcher_id

    async def events(self, owner: Owner, list_dir: List, watcher_id: str) -> list[Event]:
        watcher = self._get(owner, watcher_id)
        return await self._take(watcher, list_dir)

    def remove(self, owner: Owner, watcher_id: str) -> None:
        self._get(owner, watcher_id)
        del self._watchers[watcher_id]

    async def follow(self, owner: Owner, list_dir: List, path: str, recursive: bool) -> AsyncIterator[list[Event]]:
        """What changes under `path`, for as long as it is followed (the first yield, [], says it started)."""
        watcher_id = await self.create(owner, list_dir, path, recursive)
        watcher = self._watchers[watcher_id]
        try:
            yield []
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watcher.wake.wait(), LOOK_EVERY)
                watcher.wake.clear()
                found = await self._take(watcher, list_dir)
                if found:
                    yield found
        finally:
            self._watchers.pop(watcher_id, None)

    def told(self, owner: Owner, path: str, kinds: Callable[[bool], list[int]], info: FileInfo | None) -> None:
        """The files API changed `path` (`info`: what is there now, None once removed): each watcher covering it
        gets `kinds(it was there before)` as events."""
        for watcher in list(self._watchers.values()):
            name = watcher.name(path) if watcher.owner == owner else None
            if name is None:
                continue
            existed = name in watcher.seen
            watcher.pending.extend((name, kind, info) for kind in kinds(existed))
            if info is None:
                watcher.seen.pop(name, None)
            else:
                watcher.seen[name] = info
            watcher.wake.set()

    async def _take(self, watcher: Watcher, list_dir: List) -> list[Event]:
        now = await look(list_dir, watcher.path, watcher.recursive)
        found, watcher.pending = watcher.pending + changes(watcher.seen, now), []
        watcher.seen = now
        return found

    def _get(self, owner: Owner, watcher_id: str) -> Watcher:
        watcher = self._watchers.get(watcher_id)
        if watcher is None or watcher.owner != owner:
            raise NotFound(f"watcher {watcher_id!r} does not exist (removed, or made by another router)")
        return watcher


def written(existed: bool) -> list[int]:
    """What inotify tells of a file written whole: created (or truncated), written, and its owner set."""
    return [WRITE, CHMOD] if existed else [CREATE, WRITE, CHMOD]


def made(existed: bool) -> list[int]:
    return [] if existed else [CREATE]


def removed(existed: bool) -> list[int]:
    return [REMOVE] if existed else []


def moved_away(existed: bool) -> list[int]:
    return [RENAME] if existed else []
