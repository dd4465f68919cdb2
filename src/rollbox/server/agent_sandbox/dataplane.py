"""agent-sandbox's router data plane, served by rollbox itself: the sandbox runtime's HTTP API addressed by headers.

The client sends every call to the router with `X-Sandbox-ID` (the Sandbox's name: a rollbox sandbox id),
`X-Sandbox-Namespace`, `X-Sandbox-Port` and `X-Sandbox-Timeout`, and a path of the sandbox runtime's API: the
python runtime's `/execute`, `/upload`, `/download/…`, `/list/…`, `/exists/…`, or sandboxd's `/v1/files/…`.
No pod stands behind the router here: the node runs the command or file operation in the sandbox. The token
is the client's `Authorization` header (the connection config's `extra_headers`), as the router's own token
review reads it. Errors answer `{"detail": …}` as the router does; the client raises them as
`SandboxRequestError` with their status.
"""

from __future__ import annotations

import asyncio
import email.message
import logging
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from rollbox.errors import FileNotFound, InvalidRequest, MethodNotAllowed, RollboxError
from rollbox.models import MAX_EXEC_TIMEOUT, ExecRequest, FileInfo
from rollbox.node import Node
from rollbox.server import ports
from rollbox.server.agent_sandbox.claims import Claims
from rollbox.server.agent_sandbox.objects import DEFAULT_NAMESPACE
from rollbox.server.agent_sandbox.pods import TENANT_KEY as POD_TENANT
from rollbox.server.auth import TENANT_HEADER, ClusterSecret, Tenants
from rollbox.server.failures import logged
from rollbox.server.ports.http import forwarded
from rollbox.server.responses import json_response
from rollbox.server.routing import header, json_object, read_body

log = logging.getLogger("rollbox.server")

RUNTIME_PORT = 8888
"""The port agent-sandbox's client names for the sandbox runtime's API, which rollbox serves itself: traffic to
another port, or to a path not of that API, goes to the sandbox's own server there."""
ROUTER_HEADERS = frozenset({b"x-sandbox-id", b"x-sandbox-namespace", b"x-sandbox-port", b"x-sandbox-pod-ip",
                            b"x-sandbox-timeout", b"authorization", TENANT_HEADER.encode()})
"""Not passed to the sandbox's server, as agent-sandbox's router drops them."""
TIMED_OUT_EXIT = 124
"""The exit code a command killed by its `timeout_seconds` reports (as coreutils' timeout and sandboxd do)."""
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ROUTES: dict[tuple[str, str], str] = {
    ("POST", "/execute"): "execute", ("POST", "/upload"): "upload", ("GET", "/download"): "download",
    ("GET", "/list"): "list", ("GET", "/exists"): "exists", ("GET", "/v1/files"): "files_get",
    ("HEAD", "/v1/files"): "files_head", ("PUT", "/v1/files"): "files_put", ("DELETE", "/v1/files"): "files_delete",
}
_PREFIXES = ("/execute", "/upload", "/download", "/list", "/exists", "/v1/files")
"""The runtime's paths, each followed by nothing or by `/` and a path in the sandbox (`/list` alone is `.`: clients
drop a trailing `/.`)."""


class Gateway(RollboxError):
    code = "timeout"
    status = 504


class Target:
    """One data-plane call: who calls, which sandbox, how long it may take, and what it sent."""

    def __init__(self, tenant: str, sandbox_id: str, namespace: str, timeout: float | None, path: str,
                 query: str, body: bytes, content_type: str) -> None:
        self.tenant, self.sandbox_id, self.namespace, self.timeout = tenant, sandbox_id, namespace, timeout
        self.path, self.query, self.body, self.content_type = path, query, body, content_type

    @property
    def deadline(self) -> float | None:
        """How long the node may take: a little less than the client waits, so it reads our answer, not its own
        read timeout."""
        return None if self.timeout is None else max(0.05, self.timeout - min(0.5, self.timeout * 0.1))


class DataPlane:
    """Serves the data-plane paths in front of `app`; every other request goes to `app` untouched."""

    def __init__(self, app: ASGIApp, node: Node, claims: Claims, tenants: Tenants | ClusterSecret) -> None:
        self.app, self.node, self.claims, self.tenants = app, node, claims, tenants
        self._calls: dict[str, Callable[[Target], Awaitable[Response]]] = {
            "execute": self.execute, "upload": self.upload, "download": self.download, "list": self.list,
            "exists": self.exists, "files_get": self.files_get, "files_head": self.files_head,
            "files_put": self.files_put, "files_delete": self.files_delete}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not header(scope, b"x-sandbox-id"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        prefix = _prefix(path) if scope["type"] == "http" else None
        if prefix is None or header(scope, b"x-sandbox-port") not in (None, str(RUNTIME_PORT)):
            await self._port(scope, receive, send)
            return
        try:
            response = await self._serve(scope, receive, prefix, path)
        except ClientDisconnect:
            return
        except Exception as error:  # a command past its time is one line; a bug, a traceback (failures.py)
            answered = logged(error, log, "a data-plane call")
            response = detail(answered.status, str(answered))
        await response(scope, receive, send)

    async def _port(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Anything else with the router's headers is traffic to the sandbox's port (`X-Sandbox-Port`, else 8888),
        as agent-sandbox's router passes it to the pod (docs/ports.md)."""
        try:
            tenant = self.tenants.tenant(header(scope, b"authorization"), header(scope, TENANT_HEADER.encode()))
            sandbox_id, namespace, _ = _routing(scope)
            await self.claims.check_namespace(tenant, namespace, sandbox_id)
            port = int(header(scope, b"x-sandbox-port") or RUNTIME_PORT)
            path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
            query = scope.get("query_string", b"").decode("latin-1")
            target = ports.Target(sandbox_id, port, path + (f"?{query}" if query else ""), "header")
            stream = await self.node.open_port(tenant, sandbox_id, port)
            await ports.relay(scope, receive, send, stream, target, forwarded(scope["headers"], ROUTER_HEADERS))
        except ClientDisconnect:
            return
        except RollboxError as error:
            if scope["type"] == "websocket":
                await ports.refuse(scope, send, error)
            else:
                await detail(error.status, str(error))(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, prefix: str, path: str) -> Response:
        name = _ROUTES.get((scope["method"], prefix))
        if name is None or (prefix in ("/execute", "/upload") and path != prefix):
            raise MethodNotAllowed(f"{scope['method']} {path} is not part of the sandbox runtime's API")
        tenant = scope.get(POD_TENANT) or self.tenants.tenant(header(scope, b"authorization"),
                                                              header(scope, TENANT_HEADER.encode()))
        target = Target(tenant, *_routing(scope), urllib.parse.unquote(path[len(prefix) + 1:]),
                        scope.get("query_string", b"").decode("latin-1"), await read_body(receive),
                        header(scope, b"content-type") or "")
        await self.claims.check_namespace(tenant, target.namespace, target.sandbox_id)
        return await self._calls[name](target)

    async def _within(self, target: Target, work: Awaitable[Any]) -> Any:
        if target.deadline is None:
            return await work
        try:
            return await asyncio.wait_for(work, target.deadline)
        except TimeoutError:
            raise Gateway(f"the sandbox did not answer within the {target.timeout:g} s the request allows "
                          "(X-Sandbox-Timeout)") from None

    # -- the python runtime's API -----------------------------------------------------------------

    async def execute(self, target: Target) -> Response:
        """Runs `command` under /bin/sh -c; `timeout_seconds` ends it as a timed-out result, X-Sandbox-Timeout as
        a 504 (the router's answer), either way with the command killed."""
        body = json_object(target.body)
        command, limit = body.get("command"), body.get("timeout_seconds")
        if not isinstance(command, str) or not command:
            raise InvalidRequest("command: a non-empty string is required")
        if limit is not None and (not isinstance(limit, int | float) or limit <= 0):
            raise InvalidRequest("timeout_seconds: a positive number of seconds is required")
        deadline = target.deadline
        by_router = deadline is not None and (limit is None or deadline < limit)
        timeout = min(deadline if by_router else limit or MAX_EXEC_TIMEOUT, MAX_EXEC_TIMEOUT)
        result = await self.node.exec(target.tenant, target.sandbox_id, ExecRequest(command=command, timeout=timeout))
        if result.timed_out and by_router:
            raise Gateway(f"the command did not finish within the {target.timeout:g} s the request allows "
                          "(X-Sandbox-Timeout): it was killed")
        exit_code = TIMED_OUT_EXIT if result.timed_out else result.exit_code
        return json_response({"stdout": result.stdout, "stderr": result.stderr, "exit_code": exit_code,
                              "timed_out": result.timed_out})

    async def upload(self, target: Target) -> Response:
        """Writes the multipart field `file` to its filename (relative to the sandbox's working directory)."""
        filename, content = _multipart_file(target.body, target.content_type)
        await self._within(target, self._files(target, "write", filename, data=content))
        return json_response({"message": f"File '{filename}' uploaded successfully."})

    async def download(self, target: Target) -> Response:
        data = await self._within(target, self._files(target, "read", target.path))
        return Response(data, media_type="application/octet-stream")

    async def list(self, target: Target) -> Response:
        entries: list[FileInfo] = await self._within(target, self._files(target, "list", target.path or "."))
        return json_response([{"name": entry.name, "size": entry.size, "type": _kind(entry), "mod_time": entry.mtime}
                              for entry in entries])

    async def exists(self, target: Target) -> Response:
        try:
            await self._within(target, self._files(target, "stat", target.path or "."))
        except FileNotFound:
            return json_response({"path": target.path, "exists": False})
        return json_response({"path": target.path, "exists": True})

    # -- sandboxd's filesystem API ----------------------------------------------------------------

    async def files_get(self, target: Target) -> Response:
        """A file's bytes, or a directory's listing."""
        info: FileInfo = await self._within(target, self._files(target, "stat", target.path or "."))
        if info.type != "dir":
            return Response(await self._within(target, self._files(target, "read", target.path)),
                            media_type="application/octet-stream")
        entries: list[FileInfo] = await self._within(target, self._files(target, "list", target.path or "."))
        return json_response({"path": target.path, "entries": [
            {"name": entry.name, "size": entry.size, "type": _kind(entry, symlinks=True),
             "modified_at": datetime.fromtimestamp(entry.mtime, UTC).isoformat().replace("+00:00", "Z"),
             "mode": f"{entry.mode & 0o7777:04o}"} for entry in entries]})

    async def files_head(self, target: Target) -> Response:
        await self._within(target, self._files(target, "stat", target.path or "."))
        return Response(status_code=200)

    async def files_put(self, target: Target) -> Response:
        await self._within(target, self._files(target, "write", target.path, data=target.body))
        return Response(status_code=204)

    async def files_delete(self, target: Target) -> Response:
        recursive = urllib.parse.parse_qs(target.query).get("recursive", ["false"])[0].lower() in ("true", "1")
        await self._within(target, self._files(target, "remove", target.path, recursive=recursive))
        return Response(status_code=204)

    async def _files(self, target: Target, op: Any, path: str, **options: Any) -> Any:
        if not path:
            raise InvalidRequest("the path is empty: name a file in the sandbox")
        return await self.node.files(target.tenant, target.sandbox_id, op, path, **options)


def _prefix(path: str) -> str | None:
    for prefix in _PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            return prefix
    return None


def detail(code: int, message: str) -> Response:
    return json_response({"detail": message}, code)


def _kind(entry: FileInfo, symlinks: bool = False) -> str:
    if entry.type == "dir":
        return "directory"
    return "symlink" if symlinks and entry.type == "symlink" else "file"


def _routing(scope: Scope) -> tuple[str, str, float | None]:
    """The routing headers, checked as agent-sandbox's router checks them."""
    sandbox_id = header(scope, b"x-sandbox-id")
    if not sandbox_id:
        raise InvalidRequest("X-Sandbox-ID header is required.")
    if len(sandbox_id) > 63 or not _LABEL.match(sandbox_id):
        raise InvalidRequest("Invalid sandbox ID format.")
    namespace = header(scope, b"x-sandbox-namespace") or DEFAULT_NAMESPACE
    if len(namespace) > 63 or not _LABEL.match(namespace):
        raise InvalidRequest("Invalid namespace format.")
    port = header(scope, b"x-sandbox-port")
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise InvalidRequest("Invalid port format.")
    timeout = header(scope, b"x-sandbox-timeout")
    seconds = None
    if timeout is not None:
        try:
            seconds = float(timeout)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            raise InvalidRequest("Invalid timeout format: X-Sandbox-Timeout is a positive number of seconds.")
    return sandbox_id, namespace, seconds


def _multipart_file(body: bytes, content_type: str) -> tuple[str, bytes]:
    """The filename and content of the form field `file` of a multipart/form-data body."""
    header = email.message.Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str) or not boundary:
        raise InvalidRequest("upload: send multipart/form-data with the file in the field 'file'")
    delimiter = b"--" + boundary.encode("latin-1")
    if not body.startswith(delimiter):
        raise InvalidRequest("upload: the body does not start with the multipart boundary")
    for part in body[len(delimiter):].split(b"\r\n" + delimiter):
        if not part.startswith(b"\r\n"):
            continue  # the closing "--"
        head, found, content = part[2:].partition(b"\r\n\r\n")
        if not found:
            raise InvalidRequest("upload: a part of the form has no headers")
        fields = email.message.Message()
        for line in head.decode("utf-8", "replace").split("\r\n"):
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if fields.get_param("name", header="content-disposition") == "file":
            filename = fields.get_filename()
            if not filename:
                raise InvalidRequest("upload: the field 'file' has no filename: it names where the file goes")
            return filename, content
    raise InvalidRequest("upload: the form has no field 'file'")
