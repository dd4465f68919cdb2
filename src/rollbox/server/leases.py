"""Routes of `/v1/leases`: a trainer's leases, renewed by its heartbeats; the sandboxes it claims under one end when
it is closed or not renewed in time (docs/faults.md)."""

from __future__ import annotations

import re

from starlette.responses import Response

from rollbox.errors import InvalidRequest
from rollbox.models import KEY, LeaseInfo, LeaseRequest
from rollbox.node import Node
from rollbox.server.responses import json_response, no_content
from rollbox.server.routing import Routes

_ID = re.compile(KEY)


def add_routes(routes: Routes, node: Node) -> None:
    add = routes.add

    @add("PUT", "/v1/leases/{lease_id}", body=LeaseRequest, answer=LeaseInfo)
    async def renew_lease(tenant: str, lease_id: str, body: LeaseRequest) -> Response:
        """Opens or renews the lease: it lasts `ttl` seconds from now. Claims name it in their `lease`."""
        return json_response(await node.renew_lease(tenant, _checked(lease_id), body.ttl))

    @add("DELETE", "/v1/leases/{lease_id}", status=204)
    async def close_lease(tenant: str, lease_id: str) -> Response:
        """Closes the lease: every sandbox claimed under it ends."""
        await node.close_lease(tenant, _checked(lease_id))
        return no_content()


def _checked(lease_id: str) -> str:
    if not _ID.match(lease_id):
        raise InvalidRequest(f"lease id {lease_id[:200]!r}: use 1 to 128 letters, digits, '.', '_', '~', ':' or '-'")
    return lease_id
