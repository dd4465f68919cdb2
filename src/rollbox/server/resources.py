"""Routes of `/v1/apply`, `/v1/templates` and `/v1/warmpools`: the declarative resources."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from anyio import to_thread
from starlette.responses import Response

from rollbox.archives import reads_files, unpack_context
from rollbox.errors import InvalidRequest, RollboxError
from rollbox.models import ApplyRequest, BuildContext, TemplateInfo, WarmPoolInfo
from rollbox.node import Node
from rollbox.server.responses import json_response, no_content
from rollbox.server.routing import Routes
from rollbox.server.streams import Emit, as_rollbox_error, ndjson
from rollbox.spec import Resource, SandboxTemplate, parse_resource


def add_routes(routes: Routes, node: Node) -> None:
    add = routes.add

    @add("POST", "/v1/apply", body=ApplyRequest, answer="application/x-ndjson", admin=True)
    async def apply(tenant: str, body: ApplyRequest) -> Response:
        """Creates or updates templates and warm pools, streaming progress, then one result per resource."""
        if body.context_dir is not None and not body.context_dir.startswith("/"):
            raise InvalidRequest(f"context_dir {body.context_dir!r} must be an absolute path")
        resources = [parse_resource(document, body.context_dir) for document in body.documents]
        unknown = set(body.contexts) - {resource.metadata.name for resource in resources
                                         if isinstance(resource, SandboxTemplate)}
        if unknown:
            raise InvalidRequest(f"contexts names no template of the request: {', '.join(sorted(unknown))}")
        for resource in resources:
            if isinstance(resource, SandboxTemplate) and reads_files(resource) and body.context_dir is None \
                    and resource.metadata.name not in body.contexts:
                raise InvalidRequest(f"template {resource.metadata.name} reads files (a Dockerfile or copy steps): "
                                     "send its build context in `contexts` (rollbox's SDK and CLI do)")

        async def produce(emit: Emit) -> None:
            unpacked: list[str] = []
            try:  # in the work the answer streams, so that whatever ends the request removes the contexts
                await to_thread.run_sync(_unpack_contexts, resources, body.contexts, unpacked)
                await apply_all(emit)
            finally:
                await to_thread.run_sync(_remove, unpacked)

        async def apply_all(emit: Emit) -> None:
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


def _unpack_contexts(resources: list[Resource], contexts: dict[str, BuildContext], made: list[str]) -> None:
    """Unpacks each template's build context into a directory of its own (listed in `made`), for its build."""
    for resource in resources:
        context = contexts.get(resource.metadata.name)
        if isinstance(resource, SandboxTemplate) and context is not None:
            made.append(tempfile.mkdtemp(prefix="rollbox-context-"))
            unpack_context(context.archive, Path(made[-1]))
            resource.context_root, resource.dockerfile_text = made[-1], context.dockerfile


def _remove(directories: list[str]) -> None:
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)


def _apply_error(error: RollboxError) -> dict[str, Any]:
    return {"event": "error", "code": error.code, "message": str(error)}
