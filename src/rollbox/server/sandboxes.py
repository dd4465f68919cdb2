"""Routes of `/v1/sandboxes` (claims, commands, files) and `/v1/snapshots`."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from rollbox.errors import RollboxError
from rollbox.models import ExecResult, FileInfo, SnapshotInfo
from rollbox.node import ClaimInfo, ClaimRequest, ExecRequest, Node
from rollbox.node.local import MAX_FORK
from rollbox.server.metrics import Metrics
from rollbox.server.responses import json_response
from rollbox.server.streams import Emit, ndjson

Tenant = Callable[..., Coroutine[Any, Any, str]]
_RAW_BODY = {"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                  "format": "binary"}}}}}


class ForkRequest(BaseModel):
    count: int = Field(ge=1, le=MAX_FORK)


class SnapshotRequest(BaseModel):
    name: str


class ArchiveResult(BaseModel):
    entries: int


def router(node: Node, metrics: Metrics, auth: Tenant) -> APIRouter:
    api = APIRouter(prefix="/v1")
    tenant_of = Depends(auth)

    # -- claims -----------------------------------------------------------------------------

    @api.post("/sandboxes", status_code=201, response_model=ClaimInfo)
    async def create(body: ClaimRequest, tenant: str = tenant_of) -> Response:
        started = time.perf_counter()
        info = await node.claim(tenant, body)
        metrics.claims.inc()
        metrics.claim_seconds.observe(time.perf_counter() - started)
        return json_response(info, 201)

    @api.get("/sandboxes", response_model=list[ClaimInfo])
    async def list_(tenant: str = tenant_of) -> Response:
        return json_response(await node.claims(tenant))

    @api.get("/sandboxes/{sandbox_id}", response_model=ClaimInfo)
    async def get(sandbox_id: str, tenant: str = tenant_of) -> Response:
        return json_response(await node.get(tenant, sandbox_id))

    @api.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def delete(sandbox_id: str, tenant: str = tenant_of) -> Response:
        await node.delete(tenant, sandbox_id)
        return _done()

    @api.post("/sandboxes/{sandbox_id}/reset", response_model=ClaimInfo)
    async def reset(sandbox_id: str, tenant: str = tenant_of) -> Response:
        return json_response(await node.reset(tenant, sandbox_id))

    @api.post("/sandboxes/{sandbox_id}/fork", response_model=list[ClaimInfo])
    async def fork(sandbox_id: str, body: ForkRequest, tenant: str = tenant_of) -> Response:
        return json_response(await node.fork(tenant, sandbox_id, body.count))

    @api.post("/sandboxes/{sandbox_id}/pause", response_model=ClaimInfo)
    async def pause(sandbox_id: str, tenant: str = tenant_of) -> Response:
        return json_response(await node.pause(tenant, sandbox_id))

    @api.post("/sandboxes/{sandbox_id}/resume", response_model=ClaimInfo)
    async def resume(sandbox_id: str, tenant: str = tenant_of) -> Response:
        return json_response(await node.resume(tenant, sandbox_id))

    # -- commands ---------------------------------------------------------------------------

    @api.post("/sandboxes/{sandbox_id}/exec", response_model=ExecResult)
    async def exec_(sandbox_id: str, body: ExecRequest, tenant: str = tenant_of) -> Response:
        metrics.execs.inc()
        return json_response(await node.exec(tenant, sandbox_id, body))

    @api.post("/sandboxes/{sandbox_id}/exec/stream", response_class=Response, responses={200: {
        "content": {"application/x-ndjson": {}},
        "description": '{"type": "stdout"|"stderr", "data"} lines, then {"type": "result", "result": ExecResult}'}})
    async def exec_stream(sandbox_id: str, body: ExecRequest, tenant: str = tenant_of) -> Response:
        metrics.execs.inc()

        async def produce(emit: Emit) -> None:
            result = await node.exec(tenant, sandbox_id, body, lambda data: emit({"type": "stdout", "data": data}),
                                     lambda data: emit({"type": "stderr", "data": data}))
            emit({"type": "result", "result": result.model_dump()})

        return await ndjson(produce, _exec_error)

    # -- files ------------------------------------------------------------------------------

    @api.get("/sandboxes/{sandbox_id}/files", response_class=Response,
             responses={200: {"content": {"application/octet-stream": {}}}})
    async def read(sandbox_id: str, path: str, tenant: str = tenant_of) -> Response:
        data = await node.files(tenant, sandbox_id, "read", path)
        return Response(data, media_type="application/octet-stream")

    @api.put("/sandboxes/{sandbox_id}/files", status_code=204, openapi_extra=_RAW_BODY)
    async def write(sandbox_id: str, path: str, request: Request, mode: int = Query(0o644, ge=0, le=0o7777),
                    tenant: str = tenant_of) -> Response:
        await node.files(tenant, sandbox_id, "write", path, data=await request.body(), mode=mode)
        return _done()

    @api.delete("/sandboxes/{sandbox_id}/files", status_code=204)
    async def remove(sandbox_id: str, path: str, recursive: bool = False, tenant: str = tenant_of) -> Response:
        await node.files(tenant, sandbox_id, "remove", path, recursive=recursive)
        return _done()

    @api.get("/sandboxes/{sandbox_id}/files/list", response_model=list[FileInfo])
    async def list_files(sandbox_id: str, path: str = ".", tenant: str = tenant_of) -> Response:
        return json_response(await node.files(tenant, sandbox_id, "list", path))

    @api.get("/sandboxes/{sandbox_id}/files/stat", response_model=FileInfo)
    async def stat(sandbox_id: str, path: str, tenant: str = tenant_of) -> Response:
        return json_response(await node.files(tenant, sandbox_id, "stat", path))

    @api.post("/sandboxes/{sandbox_id}/files/mkdir", status_code=204)
    async def mkdir(sandbox_id: str, path: str, tenant: str = tenant_of) -> Response:
        await node.files(tenant, sandbox_id, "mkdir", path)
        return _done()

    @api.get("/sandboxes/{sandbox_id}/files/archive", response_class=Response,
             responses={200: {"content": {"application/x-tar": {}}}})
    async def download(sandbox_id: str, path: str, tenant: str = tenant_of) -> Response:
        return Response(await node.files(tenant, sandbox_id, "download_tar", path), media_type="application/x-tar")

    @api.put("/sandboxes/{sandbox_id}/files/archive", response_model=ArchiveResult, openapi_extra=_RAW_BODY)
    async def upload(sandbox_id: str, path: str, request: Request, tenant: str = tenant_of) -> Response:
        entries = await node.files(tenant, sandbox_id, "upload_tar", path, archive=await request.body())
        return json_response({"entries": entries})

    # -- snapshots --------------------------------------------------------------------------

    @api.post("/sandboxes/{sandbox_id}/snapshot", response_model=SnapshotInfo)
    async def snapshot(sandbox_id: str, body: SnapshotRequest, tenant: str = tenant_of) -> Response:
        return json_response(await node.snapshot(tenant, sandbox_id, body.name))

    @api.get("/snapshots", response_model=list[SnapshotInfo])
    async def snapshots(tenant: str = tenant_of) -> Response:
        return json_response(await node.snapshots(tenant))

    @api.delete("/snapshots/{name}", status_code=204)
    async def delete_snapshot(name: str, tenant: str = tenant_of) -> Response:
        await node.delete_snapshot(tenant, name)
        return _done()

    return api


def _done() -> Response:
    return Response(status_code=204)


def _exec_error(error: RollboxError) -> dict[str, Any]:
    return {"type": "error", "code": error.code, "message": str(error)}
