"""E2B's REST API for template builds (`Template.build`, `build_in_background`, `get_build_status`, `exists`, tags).

A build is a rollbox template made from a Dockerfile (server/e2b/builds.py), applied to the node by an admin's key,
as every template is: a template decides what every sandbox made from it runs. The SDK uploads files to a URL this
API gives out, signed for the tenant and the files' hash, since it sends no API key with them.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from anyio import to_thread
from pydantic import Field
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollbox.errors import NotFound, RollboxError, TemplateNotFound
from rollbox.node import Node
from rollbox.server.e2b.access import Access
from rollbox.server.e2b.api import Body, guarded, parse
from rollbox.server.e2b.builds import Build, Builds, BuildStart, split_name
from rollbox.server.routing import read_body
from rollbox.server.streams import as_rollbox_error

log = logging.getLogger("rollbox.server.e2b")


class NewBuild(Body):
    name: str = Field(min_length=1)
    tags: list[str] = Field(default_factory=list)
    cpu_count: int | None = Field(None, alias="cpuCount", ge=1)
    memory_mb: int | None = Field(None, alias="memoryMB", ge=1)


class AssignTags(Body):
    target: str
    tags: list[str] = Field(min_length=1)


class RemoveTags(Body):
    name: str
    tags: list[str] = Field(min_length=1)


def routes(node: Node, access: Access) -> list[Route]:
    builds = Builds()
    running: set[asyncio.Task[None]] = set()

    def api(handler: Callable[[Request, str], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        return guarded(handler, lambda request: access.tenant(request.headers.get("x-api-key")))

    async def request_build(request: Request, tenant: str) -> Response:
        access.tenants.require_admin(tenant)
        body = await parse(request, NewBuild)
        build = builds.start(tenant, body.name, body.tags, body.cpu_count, body.memory_mb)
        tags = sorted(tag for tag, known in builds.tags[build.template].items() if known.build_id == build.build_id)
        return JSONResponse({"templateID": build.template, "buildID": build.build_id, "public": False,
                             "names": [build.template], "aliases": [build.template], "tags": tags}, 202)

    async def upload_link(request: Request, tenant: str) -> Response:
        files_hash = request.path_params["hash"]
        if builds.has_upload(tenant, files_hash):
            return JSONResponse({"present": True}, 201)
        url = request.url_for("e2b-upload", template=request.path_params["template"], hash=files_hash)
        return JSONResponse({"present": False, "url": str(url.include_query_params(
            token=access.token(tenant, f"files:{files_hash}")))}, 201)

    async def upload(request: Request) -> Response:
        files_hash = request.path_params["hash"]
        tenant = access.holder(request.query_params.get("token"), f"files:{files_hash}")
        if tenant is None:
            return JSONResponse({"code": 401, "message": "the upload link is not signed for these files"}, 401)
        try:
            archive = await read_body(request.receive)
            await to_thread.run_sync(builds.store_upload, tenant, files_hash, archive)
        except RollboxError as error:
            return JSONResponse({"code": error.status, "message": str(error)}, error.status)
        except ClientDisconnect:
            return Response(status_code=400)
        return Response(status_code=200)

    async def start_build(request: Request, tenant: str) -> Response:
        build = builds.get(tenant, request.path_params["template"], request.path_params["build"])
        start = await parse(request, BuildStart)
        if build.status != "waiting":
            return JSONResponse({"code": 409, "message": f"build {build.build_id} was started already"}, 409)
        build.status = "building"
        build.log(f"building template {build.template} (build {build.build_id})")
        task = asyncio.create_task(_run(node, builds, build, start))
        running.add(task)
        task.add_done_callback(running.discard)
        return Response(status_code=202)

    async def build_status(request: Request, tenant: str) -> Response:
        build = builds.get(tenant, request.path_params["template"], request.path_params["build"])
        query = request.query_params
        offset = int(query["logsOffset"]) if query.get("logsOffset", "").isdigit() else 0
        limit = int(query["limit"]) if query.get("limit", "").isdigit() else 100
        return JSONResponse(build.status_page(offset, limit))

    async def alias(request: Request, tenant: str) -> Response:
        name, _ = split_name(request.path_params["alias"])
        try:
            await node.template(name)
        except TemplateNotFound:
            raise NotFound(f"template {name!r} does not exist") from None
        return JSONResponse({"templateID": name, "public": False})

    async def assign_tags(request: Request, tenant: str) -> Response:
        access.tenants.require_admin(tenant)
        body = await parse(request, AssignTags)
        template, source = split_name(body.target)
        known = builds.tags_of(template).get(source[0] if source else "default")
        if known is None:
            raise NotFound(f"template {template!r} has no tag {source[0] if source else 'default'!r}")
        tags = builds.tag(template, known.build_id, body.tags)
        return JSONResponse({"tags": tags, "buildID": known.build_id}, 201)

    async def remove_tags(request: Request, tenant: str) -> Response:
        access.tenants.require_admin(tenant)
        body = await parse(request, RemoveTags)
        known = builds.tags_of(split_name(body.name)[0])
        for tag in body.tags:
            known.pop(tag, None)
        return Response(status_code=204)

    async def list_tags(request: Request, tenant: str) -> Response:
        known = builds.tags_of(split_name(request.path_params["template"])[0])
        return JSONResponse([{"tag": tag, "buildID": info.build_id, "createdAt": info.created_at}
                             for tag, info in sorted(known.items())])

    one = "/templates/{template}"
    return [
        Route("/v3/templates", api(request_build), methods=["POST"]),
        Route(f"{one}/files/{{hash}}", api(upload_link), methods=["GET"]),
        Route(f"{one}/files/{{hash}}/upload", upload, methods=["PUT"], name="e2b-upload"),
        Route(f"/v2{one}/builds/{{build}}", api(start_build), methods=["POST"]),
        Route(f"{one}/builds/{{build}}/status", api(build_status), methods=["GET"]),
        Route("/templates/aliases/{alias}", api(alias), methods=["GET"]),
        Route("/templates/tags", api(assign_tags), methods=["POST"]),
        Route("/templates/tags", api(remove_tags), methods=["DELETE"]),
        Route(f"{one}/tags", api(list_tags), methods=["GET"]),
    ]


async def _run(node: Node, builds: Builds, build: Build, start: BuildStart) -> None:
    """Builds the template, logging its progress for the status calls; never raises."""
    context = Path(tempfile.mkdtemp(prefix="rollbox-e2b-context-"))
    try:
        template = await to_thread.run_sync(builds.template, build, start, context)
        status = await node.apply(template, build.log)
        build.log(f"template {build.template} {status}")
        build.status = "ready"
    except Exception as unexpected:
        error = as_rollbox_error(unexpected)
        if error.status >= 500:
            log.error("E2B template build %s failed", build.build_id, exc_info=unexpected)
        builds.failed(build, str(error))
    finally:
        await to_thread.run_sync(shutil.rmtree, context, True)

