"""E2B's filesystem service over a `Node`'s file operations, and its directory watchers (watch.py)."""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from google.protobuf.message import Message

from rollbox.errors import FileNotFound, NotFound
from rollbox.models import ExecRequest, FileInfo
from rollbox.node import Node
from rollbox.server.e2b.caller import Sandbox, basic_user
from rollbox.server.e2b.connect import Call, Method, RpcError
from rollbox.server.e2b.protocol import message_class as P
from rollbox.server.e2b.watch import Watchers, made, moved_away, removed

FILE_TYPES = {"file": 1, "dir": 2, "symlink": 3}
METADATA_PREFIX = "e2b."
"""E2B's metadata among a file's user extended attributes (`user.e2b.<key>`, the engine's `e2b.<key>`)."""


class FilesystemService:
    """`/filesystem.Filesystem/*`."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.watchers = Watchers()
        """Also told of the files the daemon's upload writes (envd.py)."""
        self.methods: dict[str, Method] = {
            "/filesystem.Filesystem/Stat": Method(P("filesystem.StatRequest"), self.stat),
            "/filesystem.Filesystem/ListDir": Method(P("filesystem.ListDirRequest"), self.list_dir),
            "/filesystem.Filesystem/MakeDir": Method(P("filesystem.MakeDirRequest"), self.make_dir),
            "/filesystem.Filesystem/Move": Method(P("filesystem.MoveRequest"), self.move),
            "/filesystem.Filesystem/Remove": Method(P("filesystem.RemoveRequest"), self.remove),
            "/filesystem.Filesystem/WatchDir": Method(P("filesystem.WatchDirRequest"), self.watch_dir, streaming=True),
            "/filesystem.Filesystem/CreateWatcher": Method(P("filesystem.CreateWatcherRequest"), self.create_watcher),
            "/filesystem.Filesystem/GetWatcherEvents": Method(P("filesystem.GetWatcherEventsRequest"),
                                                              self.watcher_events),
            "/filesystem.Filesystem/RemoveWatcher": Method(P("filesystem.RemoveWatcherRequest"), self.remove_watcher),
        }

    async def _files(self, call: Call, op: str, path: str, **options: Any) -> Any:
        sandbox: Sandbox = call.context
        return await self.node.files(sandbox.tenant, sandbox.id, op, path, **options)  # type: ignore[arg-type]

    async def stat(self, call: Call, request: Any) -> Message:
        return P("filesystem.StatResponse")(entry=await self._entry(call, await self._files(call, "stat",
                                                                                             request.path)))

    async def list_dir(self, call: Call, request: Any) -> Message:
        """Every entry to `depth` levels, in path order (a directory, then what it holds), as E2B's daemon walks."""
        answer = P("filesystem.ListDirResponse")()

        async def walk(path: str, level: int) -> None:
            for info in await self._files(call, "list", path):
                answer.entries.append(await self._entry(call, info))
                if info.type == "dir" and level < max(1, request.depth):
                    await walk(info.path, level + 1)

        await walk(request.path, 1)
        return answer

    async def _entry(self, call: Call, info: FileInfo) -> Message:
        """E2B's entry of a file: a symlink is described by what it leads to, with its target made absolute."""
        if info.type != "symlink" or info.target is None:
            return _entry(info)
        target = posixpath.normpath(posixpath.join(posixpath.dirname(info.path), info.target))
        try:
            pointed = await self._files(call, "stat", target)
        except NotFound:
            return _entry(info, target)
        return _entry(info.model_copy(update={"type": pointed.type, "size": pointed.size, "mode": pointed.mode}),
                      target)

    async def make_dir(self, call: Call, request: Any) -> Message:
        try:
            await self._files(call, "stat", request.path)
        except NotFound:
            await self._files(call, "mkdir", request.path)
            info = await self._files(call, "stat", request.path)
            self.tell(call, info.path, made, info)
            return P("filesystem.MakeDirResponse")(entry=await self._entry(call, info))
        raise RpcError("already_exists", f"{request.path} already exists")

    async def move(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        source = await self._files(call, "stat", request.source)  # a missing one is not_found, as a rename says
        result = await self.node.exec(sandbox.tenant, sandbox.id, ExecRequest(
            command=["mv", "-T", "--", request.source, request.destination],
            user=basic_user(call.request.headers.get("authorization"))))
        if result.exit_code != 0:
            raise RpcError("invalid_argument", result.stderr.strip() or f"mv exited {result.exit_code}")
        moved = await self._files(call, "stat", request.destination)
        self.tell(call, source.path, moved_away, None)
        self.tell(call, moved.path, made, moved)
        return P("filesystem.MoveResponse")(entry=await self._entry(call, moved))

    async def remove(self, call: Call, request: Any) -> Message:
        """Removes a file or a directory with what it holds; one that is not there is no error, as in E2B."""
        with contextlib.suppress(FileNotFound):
            info = await self._files(call, "stat", request.path)
            await self._files(call, "remove", request.path, recursive=True)
            self.tell(call, info.path, removed, None)
        return P("filesystem.RemoveResponse")()

    def tell(self, call: Call, path: str, kinds: Callable[[bool], list[int]], info: FileInfo | None) -> None:
        """Tells the sandbox's watchers what this call changed (watch.py)."""
        sandbox: Sandbox = call.context
        self.watchers.told((sandbox.tenant, sandbox.id), path, kinds, info)

    def _lister(self, call: Call) -> Callable[[str], Coroutine[Any, Any, list[FileInfo]]]:
        return lambda path: self._files(call, "list", path)

    async def _watched(self, call: Call, path: str) -> str:
        """The absolute path of a directory to watch (events name what changed relative to it)."""
        info = await self._files(call, "stat", path)
        if info.type != "dir":
            raise RpcError("invalid_argument", f"{path} is not a directory: watch a directory")
        return info.path

    async def create_watcher(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        watcher_id = await self.watchers.create((sandbox.tenant, sandbox.id), self._lister(call),
                                                 await self._watched(call, request.path), request.recursive)
        return P("filesystem.CreateWatcherResponse")(watcher_id=watcher_id)

    async def watcher_events(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        found = await self.watchers.events((sandbox.tenant, sandbox.id), self._lister(call), request.watcher_id)
        answer = P("filesystem.GetWatcherEventsResponse")()
        for name, kind, info in found:
            event = answer.events.add(name=name, type=kind)
            if info is not None:
                event.entry.CopyFrom(_entry(info))
        return answer

    async def remove_watcher(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        self.watchers.remove((sandbox.tenant, sandbox.id), request.watcher_id)
        return P("filesystem.RemoveWatcherResponse")()

    async def watch_dir(self, call: Call, request: Any) -> AsyncIterator[Message]:
        sandbox: Sandbox = call.context
        async for found in self.watchers.follow((sandbox.tenant, sandbox.id), self._lister(call),
                                                await self._watched(call, request.path), request.recursive):
            if not found:
                started = P("filesystem.WatchDirResponse")()
                started.start.SetInParent()
                yield started
            for name, kind, info in found:
                answer = P("filesystem.WatchDirResponse")(filesystem={"name": name, "type": kind})
                if info is not None and request.include_entry:
                    answer.filesystem.entry.CopyFrom(_entry(info))
                yield answer


def _entry(info: FileInfo, symlink_target: str | None = None) -> Message:
    entry = P("filesystem.EntryInfo")(
        name=info.name, path=info.path, size=info.size, mode=info.mode, permissions=_permissions(info),
        type=FILE_TYPES.get(info.type, 0), is_symlink=symlink_target is not None or info.type == "symlink",
        owner=info.owner or "", group=info.group or "", metadata=from_attributes(info.metadata))
    entry.modified_time.FromNanoseconds(int(info.mtime * 1e9))
    if symlink_target is not None or info.target is not None:
        entry.symlink_target = symlink_target or info.target
    return entry


def to_attributes(metadata: dict[str, str]) -> dict[str, str]:
    """E2B's file metadata as the file's extended attributes: `user.e2b.<key>`, its key lowercased, as E2B's daemon
    keeps it (so a program in the sandbox sets it the same way)."""
    return {METADATA_PREFIX + key.lower(): value for key, value in metadata.items()}


def from_attributes(attributes: dict[str, str] | None) -> dict[str, str]:
    return {key[len(METADATA_PREFIX):]: value for key, value in (attributes or {}).items()
            if key.startswith(METADATA_PREFIX)}


def _permissions(info: FileInfo) -> str:
    kind = {"dir": "d", "symlink": "L"}.get(info.type, "-")
    return kind + "".join(letter if info.mode & (1 << (8 - index)) else "-"
                          for index, letter in enumerate("rwxrwxrwx"))
