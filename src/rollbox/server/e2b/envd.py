"""The in-sandbox daemon E2B's SDK talks to, served by the router for every sandbox over a `Node`.

Every call names its sandbox (`E2b-Sandbox-Id`) and carries the access token the REST API gave out with it
(access.py); one whose token does not open that sandbox, or whose sandbox is gone, answers as E2B's proxy
does for a sandbox that is not there (502, "... was not found"), which the SDK reads as
`SandboxNotRunningException`. The process service runs commands through the node's exec path; the
filesystem service and the `/files` endpoint go to the node's file operations.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.parser
import email.policy
import itertools
import logging
import posixpath
import signal
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
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
)
from rollbox.models import ExecRequest, ExecResult, FileInfo
from rollbox.node import Node
from rollbox.server.e2b.access import Access
from rollbox.server.e2b.connect import Call, Method, RpcError, handle
from rollbox.server.e2b.protocol import message_class

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
        self._pids = itertools.count(1000)
        self._running: dict[tuple[str, int], asyncio.Task[ExecResult]] = {}
        """Commands in flight, by sandbox id and the pid they were announced with."""
        self.methods: dict[str, Method] = {
            "/process.Process/Start": Method(P("process.StartRequest"), self.start, streaming=True),
            "/process.Process/List": Method(P("process.ListRequest"), self.list_processes),
            "/process.Process/SendSignal": Method(P("process.SendSignalRequest"), self.send_signal),
            "/filesystem.Filesystem/Stat": Method(P("filesystem.StatRequest"), self.stat),
            "/filesystem.Filesystem/ListDir": Method(P("filesystem.ListDirRequest"), self.list_dir),
            "/filesystem.Filesystem/MakeDir": Method(P("filesystem.MakeDirRequest"), self.make_dir),
            "/filesystem.Filesystem/Move": Method(P("filesystem.MoveRequest"), self.move),
            "/filesystem.Filesystem/Remove": Method(P("filesystem.RemoveRequest"), self.remove),
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
        sandbox: Sandbox = call.context
        config = request.process
        if request.HasField("pty"):
            raise RpcError("unimplemented", "terminals (pty) are not served yet: see docs/compat-e2b.md")
        exec_request = ExecRequest(command=[config.cmd, *config.args], env=dict(config.envs) or None,
                                   cwd=config.cwd if config.HasField("cwd") else None,
                                   user=_basic_user(call.request.headers.get("authorization")),
                                   timeout=call.timeout())
        output: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        pid = next(self._pids)
        task = asyncio.ensure_future(self.node.exec(
            sandbox.tenant, sandbox.id, exec_request, lambda data: output.put_nowait(("stdout", data)),
            lambda data: output.put_nowait(("stderr", data))))
        task.add_done_callback(lambda _: output.put_nowait(None))
        key = (sandbox.id, pid)
        self._running[key] = task
        try:
            yield _event(start={"pid": pid})
            while (item := await output.get()) is not None:
                yield _event(data={item[0]: item[1].encode()})
            if task.cancelled():
                yield _event(end={"exit_code": -1, "exited": False, "status": "signal: killed"})
                return
            result = task.result()
            if result.timed_out:
                raise RpcError("deadline_exceeded", "the command ran past its timeout and was killed")
            yield _event(end=_end(result))
        finally:
            self._running.pop(key, None)
            task.cancel()

    async def list_processes(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        answer = P("process.ListResponse")()
        for sandbox_id, pid in list(self._running):
            if sandbox_id == sandbox.id:
                answer.processes.add(pid=pid)
        return answer

    async def send_signal(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        task = self._running.get((sandbox.id, request.process.pid))
        if task is None:
            raise RpcError("not_found", f"process {request.process.pid} is not running")
        task.cancel()
        return P("process.SendSignalResponse")()

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


def _event(**event: Any) -> Message:
    answer = P("process.StartResponse")()
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
