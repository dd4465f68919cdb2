"""Routes of `/v1/volumes`: a tenant's named volumes (docs/volumes.md). A claim mounts them with its `volumes`."""

from __future__ import annotations

from starlette.responses import Response

from rollbox.models import VolumeInfo, VolumeRequest
from rollbox.node import Node
from rollbox.server.responses import json_response, no_content
from rollbox.server.routing import Routes


def add_routes(routes: Routes, node: Node) -> None:
    add = routes.add

    @add("POST", "/v1/volumes", body=VolumeRequest, answer=VolumeInfo, status=201)
    async def create_volume(tenant: str, body: VolumeRequest) -> Response:
        """Creates a named volume of `size` bytes (409 if the name is taken)."""
        return json_response(await node.create_volume(tenant, body), 201)

    @add("GET", "/v1/volumes", answer=list[VolumeInfo])
    async def list_volumes(tenant: str) -> Response:
        """Lists the tenant's volumes with their size, used bytes and the sandboxes mounting them."""
        return json_response(await node.volumes(tenant))

    @add("GET", "/v1/volumes/{name}", answer=VolumeInfo)
    async def get_volume(tenant: str, name: str) -> Response:
        """Describes one volume."""
        return json_response(await node.volume(tenant, name))

    @add("DELETE", "/v1/volumes/{name}", status=204)
    async def delete_volume(tenant: str, name: str) -> Response:
        """Deletes a volume and its files (409 while a sandbox mounts it)."""
        await node.delete_volume(tenant, name)
        return no_content()
