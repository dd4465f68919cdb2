"""Ports into a sandbox: HTTP, streamed answers and WebSockets passed by the router to a server listening inside a
sandbox (docs/ports.md). The sandbox gains no way out: traffic only comes in, from the router.

A request names its sandbox and port in one of three ways:
- its path: `/v1/sandboxes/{sandbox_id}/ports/{port}/...` (rollbox's own API and SDK, `sandbox.url(port)`);
- its host: `{port}-{sandbox_id}.{domain}` for one of the router's sandbox domains (`localhost` always, and
  `rollbox serve --sandbox-domain`): E2B's `get_host(port)`, a browser;
- agent-sandbox's router headers (`X-Sandbox-ID`, `X-Sandbox-Port`), in that facade (agent_sandbox/dataplane.py).
`/v1/sandboxes/{sandbox_id}/tunnel/{port}` carries a port's raw bytes over a WebSocket (any protocol; a cluster's
router reaches the node agent holding a sandbox this way).

Only the sandbox's tenant gets in (its bearer token), or whoever holds the sandbox's traffic token
(`X-Rollbox-Traffic-Token`, or E2B's `e2b-traffic-access-token`). The credential that let a request in is not
passed to the sandbox's server.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Literal

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from rollbox.errors import Forbidden, InvalidRequest, RollboxError, Unauthorized
from rollbox.models import TRAFFIC_TOKEN_HEADER, TrafficToken
from rollbox.node.base import Node, PortStream
from rollbox.server.auth import TENANT_HEADER, ClusterSecret, SandboxTokens, Tenants
from rollbox.server.ports.http import Headers, forwarded, proxy_http
from rollbox.server.ports.websocket import proxy_websocket, tunnel
from rollbox.server.responses import error_response, json_response
from rollbox.server.routing import Routes, header

log = logging.getLogger("rollbox.server")

TRAFFIC = "traffic"
"""The purpose of a traffic token (`SandboxTokens`)."""
TRAFFIC_HEADERS = (TRAFFIC_TOKEN_HEADER.lower().encode(), b"e2b-traffic-access-token")
PREFIX = "/v1/sandboxes/"
_PATH = re.compile(r"^/v1/sandboxes/([^/]+)/(ports|tunnel)/([0-9]{1,5})(/.*)?$", re.DOTALL)
_HOST = re.compile(r"^([0-9]{1,5})-([A-Za-z0-9_~+=:-]+)\.(.+?)(?::[0-9]+)?$")
DEFAULT_DOMAINS = ("localhost",)
"""Host names under which `{port}-{sandbox_id}.` addresses a port; browsers and curl send every `*.localhost` to
the machine itself."""


def add_routes(routes: Routes, node: Node, traffic: SandboxTokens) -> None:
    @routes.add("GET", "/v1/sandboxes/{sandbox_id}/traffic_token", answer=TrafficToken)
    async def traffic_token(tenant: str, sandbox_id: str) -> Response:
        """The sandbox's traffic token: it opens the sandbox's ports, and nothing else, to whoever holds it."""
        info = await node.get(tenant, sandbox_id)
        return json_response(TrafficToken(sandbox_id=info.id, token=traffic.token(tenant, info.id)))


@dataclass(frozen=True)
class Target:
    """Where a request goes: a sandbox's port, and the request-target its server is sent."""

    sandbox_id: str
    port: int
    path: str
    style: Literal["path", "host", "header", "tunnel"]


class Ports:
    """Serves the requests addressed to a sandbox's port (by path or host) before `app` sees them."""

    def __init__(self, app: ASGIApp, node: Node, tenants: Tenants | ClusterSecret, traffic: SandboxTokens | None,
                 domains: tuple[str, ...] = DEFAULT_DOMAINS) -> None:
        self.app, self.node, self.tenants, self.traffic = app, node, tenants, traffic
        self.domains = tuple(domain.lower().rstrip(".") for domain in domains)
        """Empty on a node agent, which answers addresses by path only (its router resolved the others)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self.find(scope) if scope["type"] in ("http", "websocket") else None
        if target is None:
            await self.app(scope, receive, send)
            return
        try:
            tenant, used = self.caller(scope, target)
            headers = forwarded(scope["headers"], used)
            if target.style == "path":
                prefix = f"{PREFIX}{target.sandbox_id}/ports/{target.port}"
                headers.append((b"x-forwarded-prefix", prefix.encode()))
            await relay(scope, receive, send, await self.node.open_port(tenant, target.sandbox_id, target.port),
                        target, headers)
        except ClientDisconnect:
            return
        except RollboxError as error:
            if error.status >= 500 and error.code != "port_closed":
                log.error("port traffic failed", exc_info=error)
            await refuse(scope, send, error)

    def find(self, scope: Scope) -> Target | None:
        path = scope["path"]
        if path.startswith(PREFIX):
            match = _PATH.match(scope.get("raw_path", path.encode()).decode("latin-1"))
            if match is None:
                return None
            sandbox_id, kind, port, rest = match.groups()
            if kind == "tunnel" and (rest or scope["type"] != "websocket"):
                return None
            query = scope.get("query_string", b"").decode("latin-1")
            return Target(sandbox_id, int(port), (rest or "/") + (f"?{query}" if query else ""),
                          "tunnel" if kind == "tunnel" else "path")
        if not self.domains:
            return None
        match = _HOST.match(header(scope, b"host") or "")
        if match is None or match.group(3).lower().rstrip(".") not in self.domains:
            return None
        query = scope.get("query_string", b"").decode("latin-1")
        raw = scope.get("raw_path", path.encode()).decode("latin-1")
        return Target(match.group(2), int(match.group(1)), raw + (f"?{query}" if query else ""), "host")

    def caller(self, scope: Scope, target: Target) -> tuple[str, frozenset[bytes]]:
        """The tenant the request acts for, and the headers that said so (not passed on)."""
        if not 1 <= target.port <= 65535:
            raise InvalidRequest(f"port {target.port}: give a port from 1 to 65535")
        if isinstance(self.tenants, ClusterSecret):
            return (self.tenants.tenant(header(scope, b"authorization"), header(scope, TENANT_HEADER.encode())),
                    frozenset({b"authorization", TENANT_HEADER.encode()}))
        for name in TRAFFIC_HEADERS:
            token = header(scope, name)
            if token is not None and self.traffic is not None:
                tenant = self.traffic.holder(token, target.sandbox_id)
                if tenant is None:
                    raise _refused(target, "the traffic token does not open this sandbox")
                return tenant, frozenset({*TRAFFIC_HEADERS, TENANT_HEADER.encode()})
        authorization = header(scope, b"authorization")
        if authorization is None and not self.tenants.open:
            raise _refused(target, "send the sandbox's traffic token (X-Rollbox-Traffic-Token) or your token "
                                   "('Authorization: Bearer <token>')")
        try:
            tenant = self.tenants.tenant(authorization)
        except Unauthorized as error:
            raise _refused(target, str(error)) from None
        return tenant, frozenset({b"authorization", *TRAFFIC_HEADERS, TENANT_HEADER.encode()})


def _refused(target: Target, message: str) -> RollboxError:
    """E2B's proxy answers 403 to traffic without its token; rollbox's API 401 to a call without a token."""
    return Forbidden(message) if target.style == "host" else Unauthorized(message)


async def relay(scope: Scope, receive: Receive, send: Send, stream: PortStream, target: Target,
                headers: Headers) -> None:
    """Passes the request (an HTTP request, a WebSocket, or a tunnel's bytes) through `stream`, then closes it."""
    try:
        if target.style == "tunnel":
            await tunnel(receive, send, stream)
        elif scope["type"] == "websocket":
            await proxy_websocket(scope, receive, send, stream, target.path, headers)
        else:
            await proxy_http(scope, receive, send, stream, target.path, headers)
    finally:
        await stream.close()


async def refuse(scope: Scope, send: Send, error: RollboxError) -> None:
    """The error's answer: as an HTTP response, also to a WebSocket that was not accepted (where the server takes
    one, else a close with code 1008 or 1011)."""
    if scope["type"] == "http":
        await error_response(error)(scope, _nothing, send)
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        response = error_response(error)
        await send({"type": "websocket.http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})
        await send({"type": "websocket.http.response.body", "body": response.body})
        return
    await send({"type": "websocket.close", "code": 1011 if error.status >= 500 else 1008,
                "reason": str(error)[:120]})


async def _nothing() -> dict[str, str]:
    return {"type": "http.disconnect"}
