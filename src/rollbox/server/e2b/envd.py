"""The in-sandbox daemon E2B's SDK talks to, served by the router for every sandbox over a `Node`.

Every call names its sandbox and carries the access token the REST API gave out with it (caller.py). The
process service (process.py) runs every command as one of the node's background processes; the filesystem
service (filesystem.py) and the `/files` endpoint go to the node's file operations.
"""

from __future__ import annotations

import email.parser
import email.policy
import zlib
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollbox.errors import InvalidRequest, RollboxError, TooLarge
from rollbox.node import Node
from rollbox.server.e2b.access import Access
from rollbox.server.e2b.caller import Sandbox, SandboxGone, gone_message, http_error, rpc_error
from rollbox.server.e2b.connect import Method, handle
from rollbox.server.e2b.filesystem import FilesystemService, from_attributes, to_attributes
from rollbox.server.e2b.process import ProcessService
from rollbox.server.e2b.signed import SignedUrls
from rollbox.server.e2b.watch import written as was_written

METADATA_HEADER = "x-metadata-"
"""A file's metadata rides on its upload as `X-Metadata-<key>: <value>` headers."""
MAX_UPLOAD = 256 * 2**20
"""The most bytes one upload unpacks to (a gzip body is inflated at most this far)."""


class Daemon:
    """The process and filesystem services and the files endpoint, for every sandbox the node serves."""

    def __init__(self, node: Node, access: Access) -> None:
        self.node = node
        self.access = access
        self.signed = SignedUrls(node, access)
        self.filesystem = FilesystemService(node)
        self.methods: dict[str, Method] = {**ProcessService(node).methods, **self.filesystem.methods}

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

    # -- plain HTTP: file transfers and health -----------------------------------------------

    async def read_file(self, request: Request) -> Response:
        try:
            sandbox = await self._file_caller(request, "read")
            data = await self.node.files(sandbox.tenant, sandbox.id, "read", _path(request))
        except RollboxError as error:
            return http_error(error)
        return Response(data, media_type="application/octet-stream")

    async def write_files(self, request: Request) -> Response:
        """Each file of the upload, with the request's `X-Metadata-*` headers as its metadata; answers each file's
        absolute path, as E2B's daemon does."""
        try:
            sandbox = await self._file_caller(request, "write")
            metadata = {key[len(METADATA_HEADER):]: value for key, value in request.headers.items()
                        if key.startswith(METADATA_HEADER) and len(key) > len(METADATA_HEADER)}
            options = {"metadata": to_attributes(metadata)} if metadata else {}
            written = []
            for path, data in _uploads(request.headers, request.query_params.get("path"), await request.body()):
                await self.node.files(sandbox.tenant, sandbox.id, "write", path, data=data, **options)
                info = await self.node.files(sandbox.tenant, sandbox.id, "stat", path)
                self.filesystem.watchers.told((sandbox.tenant, sandbox.id), info.path, was_written, info)
                written.append({"name": info.name, "type": "file", "path": info.path,
                                **({"metadata": from_attributes(info.metadata)} if metadata else {})})
        except RollboxError as error:
            return http_error(error)
        return JSONResponse(written)

    async def _file_caller(self, request: Request, operation: str) -> Sandbox:
        """The sandbox a file transfer is for: named by its headers, or by a signed URL's signature alone."""
        if request.headers.get("e2b-sandbox-id") or "signature" not in request.query_params:
            return await self.guard(request)
        return await self.signed.holder(request.query_params, operation)

    async def health(self, request: Request) -> Response:
        try:
            sandbox = await self.guard(request)
            info = await self.node.get(sandbox.tenant, sandbox.id)
        except RollboxError as error:
            return http_error(error)
        if info.state != "running":
            return http_error(SandboxGone(f"{gone_message(sandbox.id)}: it is {info.state}"))
        return Response(status_code=204)


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
