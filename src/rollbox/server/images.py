"""Routes of `/v1/images` and `/v1/registries`: registry images on the node(s), and each tenant's registry
credentials (docs/images.md). A claim starts an image with `ClaimRequest.image`."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from rollbox.errors import RollboxError
from rollbox.models import ImageInfo, ImagesRequest, RegistryInfo, RegistryLogin
from rollbox.node import Node
from rollbox.server.responses import json_response, no_content
from rollbox.server.routing import Query, Routes
from rollbox.server.streams import Emit, as_rollbox_error, ndjson


def add_routes(routes: Routes, node: Node) -> None:
    add = routes.add

    @add("POST", "/v1/images/pull", body=ImagesRequest, answer="application/x-ndjson")
    async def pull(tenant: str, body: ImagesRequest) -> Response:
        """Pulls images with the tenant's credentials, streaming progress per layer, then one event per image."""

        async def produce(emit: Emit) -> None:
            for image in body.images:
                try:
                    one = ImagesRequest(images=[image], all_nodes=body.all_nodes)
                    pulled = await node.pull_images(tenant, one, lambda message, image=image:
                                                    emit({"event": "progress", "image": image, "message": message}))
                except Exception as unexpected:
                    error = as_rollbox_error(unexpected)
                    emit({"event": "error", "image": image, "code": error.code, "message": str(error)})
                    break
                emit({"event": "pulled", "image": image, "info": pulled[0].model_dump()})
            emit({"event": "done"})

        return await ndjson(produce, _pull_error)

    @add("POST", "/v1/images/prefetch", body=ImagesRequest, status=202)
    async def prefetch(tenant: str, body: ImagesRequest) -> Response:
        """Starts pulling the images in the background (the next batch's), answering at once."""
        await node.prefetch(tenant, body)
        return json_response({"images": len(body.images)}, 202)

    @add("GET", "/v1/images", answer=list[ImageInfo])
    async def list_images(tenant: str) -> Response:
        """The images the tenant pulled or claimed, with their sizes (`shared`: bytes other listed images have
        too)."""
        return json_response(await node.images(tenant))

    @add("DELETE", "/v1/images", status=204, query=(Query("image"),))
    async def remove_image(tenant: str, image: str) -> Response:
        """Drops an image (`?image=` its name or digest) from the tenant's; its files go once nothing holds them."""
        await node.remove_image(tenant, image)
        return no_content()

    @add("POST", "/v1/images/prune", admin=True)
    async def prune(tenant: str) -> Response:
        """Removes every image layer no image in use, template, snapshot or sandbox holds."""
        return json_response({"freed": await node.prune_images()})

    @add("PUT", "/v1/registries/{host}", body=RegistryLogin, answer=RegistryInfo)
    async def login(tenant: str, host: str, body: RegistryLogin) -> Response:
        """Stores the tenant's credentials for a registry; pulls and claims of its images use them."""
        return json_response(await node.login(tenant, host, body))

    @add("GET", "/v1/registries", answer=list[RegistryInfo])
    async def list_registries(tenant: str) -> Response:
        """The registries the tenant has credentials for (user names only)."""
        return json_response(await node.registries(tenant))

    @add("DELETE", "/v1/registries/{host}", status=204)
    async def logout(tenant: str, host: str) -> Response:
        """Forgets the tenant's credentials for a registry."""
        await node.logout(tenant, host)
        return no_content()


def _pull_error(error: RollboxError) -> dict[str, Any]:
    return {"event": "error", "code": error.code, "message": str(error)}
