"""Routes of `/v1/apply`, `/v1/templates` and `/v1/warmpools`: the declarative resources."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from rollbox.errors import InvalidRequest, RollboxError
from rollbox.models import ApplyRequest, TemplateInfo, WarmPoolInfo
from rollbox.node import Node
from rollbox.server.responses import json_response, no_content
from rollbox.server.routing import Routes
from rollbox.server.streams import Emit, as_rollbox_error, ndjson
from rollbox.spec import parse_resource


def add_routes(routes: Routes, node: Node) -> None:
    add = routes.add

    @add("POST", "/v1/apply", body=ApplyRequest, answer="application/x-ndjson", admin=True)
    async def apply(tenant: str, body: ApplyRequest) -> Response:
        """Creates or updates templates and warm pools, streaming progress, then one result per resource."""
        if body.context_dir is not None and not body.context_dir.startswith("/"):
            raise InvalidRequest(f"context_dir {body.context_dir!r} must be an absolute path")
        resources = [parse_resource(document, body.context_dir) for document in body.documents]

        async def produce(emit: Emit) -> None:
            for resource in resources:
                kind, name = resource.kind, resource.metadata.name
                try:
                    status = await node.apply(resource, lambda message, kind=kind, name=name: emit(
                        {"event": "progress", "kind": kind, "name": name, "message": message}), tenant)
                except Exception as unexpected:
                    error = as_rollbox_error(unexpected)
                    emit({"event": "error", "kind": kind, "name": name, "code": error.code, "message": str(error)})
                    break
                emit({"event": "applied", "kind": kind, "name": name, "status": status})
            emit({"event": "done"})

        return await ndjson(produce, _apply_error)

    @add("GET", "/v1/templates", answer=list[TemplateInfo])
    async def list_templates(tenant: str) -> Response:
        """Lists the built templates."""
        return json_response(await node.templates())

    @add("GET", "/v1/templates/{name}", answer=TemplateInfo)
    async def get_template(tenant: str, name: str) -> Response:
        """Describes one template."""
        return json_response(await node.template(name))

    @add("DELETE", "/v1/templates/{name}", status=204, admin=True)
    async def delete_template(tenant: str, name: str) -> Response:
        """Deletes a template no warm pool uses; its sandboxes keep running."""
        await node.delete_template(name)
        return no_content()

    @add("GET", "/v1/warmpools", answer=list[WarmPoolInfo])
    async def list_warmpools(tenant: str) -> Response:
        """Lists the warm pools with their ready and starting counts."""
        return json_response(await node.warmpools())

    @add("GET", "/v1/warmpools/{name}", answer=WarmPoolInfo)
    async def get_warmpool(tenant: str, name: str) -> Response:
        """Describes one warm pool."""
        return json_response(await node.warmpool(name))

    @add("DELETE", "/v1/warmpools/{name}", status=204, admin=True)
    async def delete_warmpool(tenant: str, name: str) -> Response:
        """Deletes a warm pool and its ready sandboxes; claimed ones stay."""
        await node.delete_warmpool(name)
        return no_content()


def _apply_error(error: RollboxError) -> dict[str, Any]:
    return {"event": "error", "code": error.code, "message": str(error)}
