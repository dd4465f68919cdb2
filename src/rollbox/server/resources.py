"""Routes of `/v1/apply`, `/v1/templates` and `/v1/warmpools`: the declarative resources."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel
from starlette.responses import Response

from rollbox.errors import InvalidRequest, RollboxError
from rollbox.node import Node, TemplateInfo, WarmPoolInfo
from rollbox.server.responses import json_response
from rollbox.server.sandboxes import Tenant
from rollbox.server.streams import Emit, as_rollbox_error, ndjson
from rollbox.spec import parse_resource


class ApplyRequest(BaseModel):
    documents: list[dict[str, Any]]
    context_dir: str | None = None
    """The directory `copy` steps read from, on the server's machine (the YAML file's directory)."""


def router(node: Node, auth: Tenant) -> APIRouter:
    api = APIRouter(prefix="/v1", dependencies=[Depends(auth)])

    @api.post("/apply", response_class=Response, responses={200: {
        "content": {"application/x-ndjson": {}},
        "description": '{"event": "progress"|"applied"|"error"|"done", ...} lines'}})
    async def apply(body: ApplyRequest) -> Response:
        if body.context_dir is not None and not body.context_dir.startswith("/"):
            raise InvalidRequest(f"context_dir {body.context_dir!r} must be an absolute path")
        resources = [parse_resource(document, body.context_dir) for document in body.documents]

        async def produce(emit: Emit) -> None:
            for resource in resources:
                kind, name = resource.kind, resource.metadata.name
                try:
                    status = await node.apply(resource, lambda message, kind=kind, name=name: emit(
                        {"event": "progress", "kind": kind, "name": name, "message": message}))
                except Exception as unexpected:
                    error = as_rollbox_error(unexpected)
                    emit({"event": "error", "kind": kind, "name": name, "code": error.code, "message": str(error)})
                    break
                emit({"event": "applied", "kind": kind, "name": name, "status": status})
            emit({"event": "done"})

        return await ndjson(produce, _apply_error)

    @api.get("/templates", response_model=list[TemplateInfo])
    async def templates() -> Response:
        return json_response(await node.templates())

    @api.get("/templates/{name}", response_model=TemplateInfo)
    async def template(name: str) -> Response:
        return json_response(await node.template(name))

    @api.delete("/templates/{name}", status_code=204)
    async def delete_template(name: str) -> Response:
        await node.delete_template(name)
        return Response(status_code=204)

    @api.get("/warmpools", response_model=list[WarmPoolInfo])
    async def warmpools() -> Response:
        return json_response(await node.warmpools())

    @api.get("/warmpools/{name}", response_model=WarmPoolInfo)
    async def warmpool(name: str) -> Response:
        return json_response(await node.warmpool(name))

    @api.delete("/warmpools/{name}", status_code=204)
    async def delete_warmpool(name: str) -> Response:
        await node.delete_warmpool(name)
        return Response(status_code=204)

    return api


def _apply_error(error: RollboxError) -> dict[str, Any]:
    return {"event": "error", "code": error.code, "message": str(error)}
