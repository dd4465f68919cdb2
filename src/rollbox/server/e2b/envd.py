"""The in-sandbox daemon E2B's SDK talks to, served by the router for every sandbox over a `Node`.

Every call names its sandbox (`E2b-Sandbox-Id`) and carries the access token the REST API gave out with it
(access.py); one whose token does not open that sandbox, or whose sandbox is gone, answers as E2B's proxy
does for a sandbox that is not there (502, "... was not found"), which the SDK reads as
`SandboxNotRunningException`. The process service runs every command as one of the node's background
processes (docs/processes.md), since the SDK asks for a foreground and a background command alike; the
filesystem service and the `/files` endpoint go to the node's file operations.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.parser
import email.policy
import logging
import posixpath
import signal
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollbox.errors import (
    Conflict,
    InvalidRequest,
    NodeLost,
    NotFound,
    RollboxError,
    SandboxNotFound,
    SandboxNotRunning,
    TooLarge,
    Unauthorized,
    from_code,
)
from rollbox.models import ExecRequest, ExecResult, FileInfo, ProcessControl, ProcessInfo, ProcessRequest, PtySize
from rollbox.node import Node
from rollbox.server.e2b.access import Access
from rollbox.server.e2b.connect import Call, Method, RpcError, handle
from rollbox.server.e2b.protocol import message_class
from rollbox.server.e2b.watch import Watchers, follow

log = logging.getLogger("rollbox.server.e2b")

MAX_UPLOAD = 256 * 2**20
"""The most bytes one upload unpacks to (a gzip body is inflated at most this far)."""
FILE_TYPES = {"file": 1, "dir": 2, "symlink": 3}
P = message_class


@dataclass(frozen=True)
class Sandbox:
    tenant: str
    id: str


class SandboxGone(RollboxError):
    """The sandbox is not there for this caller: deleted, another tenant's, or a token that does not open it."""

    code = "sandbox_not_found"
    status = 502


def gone_message(sandbox_id: str) -> str:
    return f"The sandbox {sandbox_id} was not found"


def rpc_error(error: Exception) -> RpcError:
    """What a call's caller is told of a failure, in the codes the SDK maps to its exceptions."""
    if isinstance(error, SandboxGone | SandboxNotFound | SandboxNotRunning | NodeLost):
        return RpcError("unavailable", f"{error} (the sandbox was not found)")
    if isinstance(error, NotFound):
        return RpcError("not_found", str(error))
    if isinstance(error, Conflict):
        return RpcError("already_exists", str(error))
    if isinstance(error, Unauthorized):
        return RpcError("unauthenticated", str(error))
    if isinstance(error, TooLarge):
        return RpcError("resource_exhausted", str(error))
    if isinstance(error, InvalidRequest):
        return RpcError("invalid_argument", str(error))
    if isinstance(error, ValidationError):  # a request rollbox's models refuse (a working directory too long, ...)
        return RpcError("invalid_argument", f"invalid arguments: {error.errors(include_url=False)}")
    if isinstance(error, RollboxError):
        return RpcError("unavailable", str(error))
    log.error("E2B daemon call failed", exc_info=error)
    return RpcError("internal", f"the server failed: {error}; see its log")


def http_error(error: RollboxError) -> Response:
    """A failure of the daemon's plain HTTP endpoints, as `{"code": <status>, "message"}`."""
    if isinstance(error, SandboxGone | SandboxNotFound | SandboxNotRunning | NodeLost):
        return JSONResponse({"code": 502, "message": f"{error} (the sandbox was not found)"}, 502)
    if error.status >= 500:
        log.error("E2B daemon call failed", exc_info=error)
    return JSONResponse({"code": error.status, "message": str(error)}, error.status)


class Daemon:
    """The process and filesystem services and the files endpoint, for every sandbox the node serves."""

    def __init__(self, node: Node, access: Access) -> None:
        self.node = node
        self.access = access
        self._forgetting: set[asyncio.Future[None]] = set()
        self._watchers = Watchers()
        self.methods: dict[str, Method] = {
            "/process.Process/Start": Method(P("process.StartRequest"), self.start, streaming=True),
            "/process.Process/Connect": Method(P("process.ConnectRequest"), self.connect, streaming=True),
            "/process.Process/List": Method(P("process.ListRequest"), self.list_processes),
            "/process.Process/SendSignal": Method(P("process.SendSignalRequest"), self.send_signal),
            "/process.Process/SendInput": Method(P("process.SendInputRequest"), self.send_input),
            "/process.Process/StreamInput": Method(P("process.StreamInputRequest"), self.stream_input,
                                                   client_streaming=True),
            "/process.Process/CloseStdin": Method(P("process.CloseStdinRequest"), self.close_stdin),
            "/process.Process/Update": Method(P("process.UpdateRequest"), self.update),
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

    def routes(self) -> list[Route]:
        return [Route("/process.Process/{name}", self.rpc, methods=["POST"]),
                Route("/filesystem.Filesystem/{name}", self.rpc, methods=["POST"]),
                Route("/files", self.read_file, methods=["GET"]),
                Route("/files", self.write_files, methods=["POST"]),
                Route("/health", self.health, methods=["GET"])]

    # -- who calls ---------------------------------------------------------------------------

    async def guard(self, request: Request) -> Sandbox:
        sandbox_id = request.headers.get("e2b-sandbox-id", "")
        if not sandbox_id:
            raise InvalidRequest("say which sandbox the call is for in the E2b-Sandbox-Id header")
        tenant = self.access.holder(request.headers.get("x-access-token"), sandbox_id)
        if tenant is None:
            raise SandboxGone(gone_message(sandbox_id))
        return Sandbox(tenant, sandbox_id)

    async def rpc(self, request: Request) -> Response:
        method = self.methods.get(request.url.path)
        if method is None:
            return JSONResponse({"code": "unimplemented", "message": f"{request.url.path} is not served here: "
                                 "see docs/compat-e2b.md"}, 501)
        return await handle(request, method, self.guard, rpc_error)

    # -- processes ---------------------------------------------------------------------------

    async def start(self, call: Call, request: Any) -> AsyncIterator[Message]:
        """Starts a background process and follows it: a foreground `commands.run` and a background handle send the
        same call, and a handle may kill it, write its stdin or let go of it and connect again later."""
        sandbox: Sandbox = call.context
        config = request.process
        size = request.pty.size if request.HasField("pty") else None
        info = await self.node.start_process(sandbox.tenant, sandbox.id, ProcessRequest(
            command=[config.cmd, *config.args], env=dict(config.envs) or None,
            cwd=config.cwd if config.HasField("cwd") else None,
            user=_basic_user(call.request.headers.get("authorization")),
            pty=PtySize(rows=size.rows or 24, cols=size.cols or 80) if size is not None else None,
            close_stdin=request.HasField("stdin") and not request.stdin, timeout=call.timeout(),
            tag=request.tag if request.HasField("tag") else None))
        async for event in self._follow(sandbox, info.id, 0, pty=size is not None):
            yield event

    async def connect(self, call: Call, request: Any) -> AsyncIterator[Message]:
        """Follows a running process again, from its output of now on."""
        sandbox: Sandbox = call.context
        info = await self._find(sandbox, request.process)
        async for event in self._follow(sandbox, info.id, None, pty=info.pty, response="process.ConnectResponse"):
            yield event

    async def _follow(self, sandbox: Sandbox, process_id: str, offset: int | None, *, pty: bool,
                      response: str = "process.StartResponse") -> AsyncIterator[Message]:
        async for event in self.node.process_events(sandbox.tenant, sandbox.id, process_id, offset):
            if event.type == "start":
                yield _event(response, start={"pid": event.pid or 0})
            elif event.type in ("stdout", "stderr"):
                yield _event(response, data={"pty" if pty else event.type: event.data.encode()})
            elif event.type == "error":
                raise rpc_error(from_code(event.code or "internal", event.message or "the process was lost"))
            elif event.type == "end" and event.result is not None:
                self._forget(sandbox, process_id)
                if event.result.timed_out:
                    raise RpcError("deadline_exceeded", "the command ran past its timeout and was killed")
                yield _event(response, end=_end(event.result))
                return

    def _forget(self, sandbox: Sandbox, process_id: str) -> None:
        """Deletes an ended process in the background: its end is told, so nothing of it is kept to read back, and
        the stream closes without waiting."""
        task = asyncio.ensure_future(self.node.delete_process(sandbox.tenant, sandbox.id, process_id))
        self._forgetting.add(task)
        task.add_done_callback(self._forgotten)

    def _forgotten(self, task: asyncio.Future[None]) -> None:
        self._forgetting.discard(task)
        if not task.cancelled() and isinstance(task.exception(), Exception) and not isinstance(
                task.exception(), NotFound | SandboxNotRunning | NodeLost):
            log.warning("could not delete an ended process", exc_info=task.exception())

    async def _find(self, sandbox: Sandbox, selector: Any) -> ProcessInfo:
        """The process a selector names by pid or tag: a running one before one that ended."""
        field = selector.WhichOneof("selector")
        value = getattr(selector, field) if field else None
        found = sorted((info for info in await self.node.processes(sandbox.tenant, sandbox.id)
                        if getattr(info, field or "pid") == value), key=lambda info: (info.running, info.started_at))
        if not found:
            raise RpcError("not_found", f"no process with {field} {value!r}")
        return found[-1]

    async def _control(self, call: Call, selector: Any, control: ProcessControl) -> None:
        sandbox: Sandbox = call.context
        info = await self._find(sandbox, selector)
        await self.node.control_process(sandbox.tenant, sandbox.id, info.id, control)

    async def list_processes(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        answer = P("process.ListResponse")()
        for info in await self.node.processes(sandbox.tenant, sandbox.id):
            if info.running:
                entry = answer.processes.add(pid=info.pid)
                entry.config.cmd, *args = info.command or [""]
                entry.config.args.extend(args)
                if info.cwd is not None:
                    entry.config.cwd = info.cwd
                if info.tag is not None:
                    entry.tag = info.tag
        return answer

    async def send_signal(self, call: Call, request: Any) -> Message:
        await self._control(call, request.process, ProcessControl(signal=request.signal or signal.SIGKILL))
        return P("process.SendSignalResponse")()

    async def send_input(self, call: Call, request: Any) -> Message:
        data = getattr(request.input, request.input.WhichOneof("input") or "stdin")
        await self._control(call, request.process, ProcessControl(stdin=data.decode(errors="replace")))
        return P("process.SendInputResponse")()

    async def stream_input(self, call: Call, requests: AsyncIterator[Any]) -> Message:
        """Input in order over one stream: the process first, then its data."""
        sandbox: Sandbox = call.context
        target: ProcessInfo | None = None
        async for message in requests:
            kind = message.WhichOneof("event")
            if kind == "start":
                target = await self._find(sandbox, message.start.process)
            elif kind == "data":
                if target is None:
                    raise RpcError("failed_precondition", "name the process in the stream's first message")
                data = getattr(message.data.input, message.data.input.WhichOneof("input") or "stdin")
                await self.node.control_process(sandbox.tenant, sandbox.id, target.id,
                                                ProcessControl(stdin=data.decode(errors="replace")))
        return P("process.StreamInputResponse")()

    async def close_stdin(self, call: Call, request: Any) -> Message:
        await self._control(call, request.process, ProcessControl(close_stdin=True))
        return P("process.CloseStdinResponse")()

    async def update(self, call: Call, request: Any) -> Message:
        if request.HasField("pty"):
            size = request.pty.size
            await self._control(call, request.process, ProcessControl(resize=PtySize(rows=size.rows or 24,
                                                                                      cols=size.cols or 80)))
        return P("process.UpdateResponse")()

    # -- filesystem --------------------------------------------------------------------------

    async def _files(self, call: Call, op: str, path: str, **options: Any) -> Any:
        sandbox: Sandbox = call.context
        return await self.node.files(sandbox.tenant, sandbox.id, op, path, **options)  # type: ignore[arg-type]

    async def stat(self, call: Call, request: Any) -> Message:
        return P("filesystem.StatResponse")(entry=_entry(await self._files(call, "stat", request.path)))

    async def list_dir(self, call: Call, request: Any) -> Message:
        answer = P("filesystem.ListDirResponse")()
        pending = [(request.path, 1)]
        while pending:
            path, level = pending.pop(0)
            for info in await self._files(call, "list", path):
                answer.entries.append(_entry(info))
                if info.type == "dir" and level < max(1, request.depth):
                    pending.append((info.path, level + 1))
        return answer

    async def make_dir(self, call: Call, request: Any) -> Message:
        try:
            await self._files(call, "stat", request.path)
        except NotFound:
            await self._files(call, "mkdir", request.path)
            return P("filesystem.MakeDirResponse")(entry=_entry(await self._files(call, "stat", request.path)))
        raise RpcError("already_exists", f"{request.path} already exists")

    async def move(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        await self._files(call, "stat", request.source)  # a missing source is not_found, as a rename says
        result = await self.node.exec(sandbox.tenant, sandbox.id, ExecRequest(
            command=["mv", "-T", "--", request.source, request.destination],
            user=_basic_user(call.request.headers.get("authorization"))))
        if result.exit_code != 0:
            raise RpcError("invalid_argument", result.stderr.strip() or f"mv exited {result.exit_code}")
        return P("filesystem.MoveResponse")(entry=_entry(await self._files(call, "stat", request.destination)))

    async def remove(self, call: Call, request: Any) -> Message:
        await self._files(call, "remove", request.path, recursive=True)
        return P("filesystem.RemoveResponse")()

    def _lister(self, call: Call) -> Callable[[str], Coroutine[Any, Any, list[FileInfo]]]:
        return lambda path: self._files(call, "list", path)

    async def create_watcher(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        watcher_id = await self._watchers.create((sandbox.tenant, sandbox.id), self._lister(call), request.path,
                                                 request.recursive)
        return P("filesystem.CreateWatcherResponse")(watcher_id=watcher_id)

    async def watcher_events(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        found = await self._watchers.events((sandbox.tenant, sandbox.id), self._lister(call), request.watcher_id)
        answer = P("filesystem.GetWatcherEventsResponse")()
        for name, kind, info in found:
            event = answer.events.add(name=name, type=kind)
            if info is not None:
                event.entry.CopyFrom(_entry(info))
        return answer

    async def remove_watcher(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        self._watchers.remove((sandbox.tenant, sandbox.id), request.watcher_id)
        return P("filesystem.RemoveWatcherResponse")()

    async def watch_dir(self, call: Call, request: Any) -> AsyncIterator[Message]:
        async for found in follow(self._lister(call), request.path, request.recursive):
            if not found:
                started = P("filesystem.WatchDirResponse")()
                started.start.SetInParent()
                yield started
            for name, kind, info in found:
                answer = P("filesystem.WatchDirResponse")(filesystem={"name": name, "type": kind})
                if info is not None and request.include_entry:
                    answer.filesystem.entry.CopyFrom(_entry(info))
                yield answer

    # -- plain HTTP: file transfers and health -----------------------------------------------

    async def read_file(self, request: Request) -> Response:
        try:
            sandbox = await self.guard(request)
            data = await self.node.files(sandbox.tenant, sandbox.id, "read", _path(request))
        except RollboxError as error:
            return http_error(error)
        return Response(data, media_type="application/octet-stream")

    async def write_files(self, request: Request) -> Response:
        try:
            sandbox = await self.guard(request)
            written = []
            for path, data in _uploads(request.headers, request.query_params.get("path"), await request.body()):
                await self.node.files(sandbox.tenant, sandbox.id, "write", path, data=data)
                written.append({"name": posixpath.basename(path), "type": "file", "path": path})
        except RollboxError as error:
            return http_error(error)
        return JSONResponse(written)

    async def health(self, request: Request) -> Response:
        try:
            sandbox = await self.guard(request)
            info = await self.node.get(sandbox.tenant, sandbox.id)
        except RollboxError as error:
            return http_error(error)
        if info.state != "running":
            return http_error(SandboxGone(f"{gone_message(sandbox.id)}: it is {info.state}"))
        return Response(status_code=204)


def _event(response: str, **event: Any) -> Message:
    answer = P(response)()
    for name, fields in event.items():
        getattr(answer.event, name).SetInParent()
        for key, value in fields.items():
            setattr(getattr(answer.event, name), key, value)
    return answer


def _end(result: ExecResult) -> dict[str, Any]:
    if result.signal:
        name = signal.Signals(result.signal).name.removeprefix("SIG").lower() if result.signal < 65 else result.signal
        return {"exit_code": -1, "exited": False, "status": f"signal: {name}"}
    return {"exit_code": result.exit_code or 0, "exited": True, "status": f"exit status {result.exit_code}"}


def _entry(info: FileInfo) -> Message:
    entry = P("filesystem.EntryInfo")(
        name=info.name, path=info.path, size=info.size, mode=info.mode, permissions=_permissions(info),
        type=FILE_TYPES.get(info.type, 0), is_symlink=info.type == "symlink")
    entry.modified_time.FromNanoseconds(int(info.mtime * 1e9))
    if info.target is not None:
        entry.symlink_target = info.target
    return entry


def _permissions(info: FileInfo) -> str:
    kind = {"dir": "d", "symlink": "L"}.get(info.type, "-")
    return kind + "".join(letter if info.mode & (1 << (8 - index)) else "-"
                          for index, letter in enumerate("rwxrwxrwx"))


def _basic_user(authorization: str | None) -> str | None:
    """The user an `Authorization: Basic <user:>` header names (the SDK's `user=`), else the sandbox's own."""
    scheme, _, encoded = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode().partition(":")[0] or None
    except (binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("the Authorization header is not basic credentials of a user") from None


def _path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise InvalidRequest("give the file's path as ?path=")
    return path


def _uploads(headers: Any, path: str | None, body: bytes) -> list[tuple[str, bytes]]:
    """The files of an upload: one `application/octet-stream` body (maybe gzipped) at `path`, or the parts of a
    `multipart/form-data` body, each at its file name (`path`, for a single part, wins)."""
    media = headers.get("content-type", "")
    if media.split(";", 1)[0].strip().lower() == "multipart/form-data":
        document = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + media.encode("latin-1") + b"\r\n\r\n" + body)
        parts = [(part.get_filename() or "", part.get_payload(decode=True) or b"") for part in document.iter_parts()]
        if len(parts) == 1 and path:
            parts = [(path, parts[0][1])]
        if not parts or not all(name for name, _ in parts):
            raise InvalidRequest("every part of the upload needs a file name (its path in the sandbox)")
        return parts
    if not path:
        raise InvalidRequest("give the file's path as ?path=")
    if headers.get("content-encoding", "").lower() == "gzip":
        inflate = zlib.decompressobj(wbits=31)
        try:
            body = inflate.decompress(body, MAX_UPLOAD + 1)
        except zlib.error:
            raise InvalidRequest("the upload says gzip but is not gzip data") from None
        if len(body) > MAX_UPLOAD:
            raise TooLarge(f"the upload unpacks to more than {MAX_UPLOAD} bytes")
    return [(path, body)]
