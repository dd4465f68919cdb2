"""The part of the Kubernetes API agent-sandbox's client uses: SandboxClaims (create, get, list, watch, delete),
Sandboxes (get, list, watch), and the discovery documents kubectl reads first.

Errors answer Kubernetes `Status` objects, which the `kubernetes` client raises as `ApiException` with their code.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, Router, request_response

from rollbox.errors import InvalidRequest, NotFound, RollboxError
from rollbox.models import SandboxInfo
from rollbox.server.agent_sandbox import selectors
from rollbox.server.agent_sandbox.claims import Claims
from rollbox.server.agent_sandbox.objects import (
    CLAIM_API,
    CLAIM_GROUP,
    SANDBOX_API,
    SANDBOX_GROUP,
    VERSION,
    namespace_of,
    now_version,
    sandbox_object,
    status,
    version_at,
)
from rollbox.server.auth import TENANT_HEADER, ClusterSecret, Tenants
from rollbox.server.responses import json_response
from rollbox.server.routing import json_object

CLAIMS = f"/apis/{CLAIM_GROUP}/{VERSION}/namespaces/{{namespace}}/sandboxclaims"
SANDBOXES = f"/apis/{SANDBOX_GROUP}/{VERSION}/namespaces/{{namespace}}/sandboxes"
WATCH_POLL = 0.5
"""Seconds between a watch's looks at the node; changes made through this router wake it at once."""
DEFAULT_WATCH_SECONDS = 300
MAX_WATCH_SECONDS = 3600
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            409: "AlreadyExists", 410: "Expired", 413: "RequestEntityTooLarge", 422: "Invalid",
            429: "TooManyRequests", 503: "ServiceUnavailable"}
Handler = Callable[[Request, str], Awaitable[Response]]
log = logging.getLogger("rollbox.server")


class Entry(Protocol):
    """What a watch follows of one object."""

    name: str
    created_version: int
    version: int
    labels: dict[str, str]
    namespace: str

    def as_now(self, deleted_at: float | None = None) -> dict[str, Any]: ...


class SandboxEntry:
    def __init__(self, info: SandboxInfo, pod_ip: str) -> None:
        self.info, self.name, self.namespace, self.pod_ip = info, info.id, namespace_of(info), pod_ip
        self.created_version = version_at(info.created_at)
        self.version = self.created_version + 1
        self.labels = sandbox_object(info)["metadata"]["labels"]

    def as_now(self, deleted_at: float | None = None) -> dict[str, Any]:
        obj = sandbox_object(self.info, self.pod_ip)
        if deleted_at is not None:
            obj["metadata"]["resourceVersion"] = str(version_at(deleted_at) + 1)
        return obj


class KubernetesApi:
    """The Kubernetes API's routes over `claims`, as a Starlette router; every answer, errors too, is Kubernetes'."""

    def __init__(self, claims: Claims, tenants: Tenants | ClusterSecret) -> None:
        self.claims, self.tenants = claims, tenants
        self.started = version_at(time.time())
        get, serve = ["GET"], self._serve
        self.router = Router([
            Route("/api", serve(self.core_versions), methods=get),
            Route("/apis", serve(self.api_groups), methods=get),
            Route(f"/apis/{SANDBOX_GROUP}/{VERSION}", serve(self.sandbox_resources), methods=get),
            Route(f"/apis/{CLAIM_GROUP}/{VERSION}", serve(self.claim_resources), methods=get),
            Route(CLAIMS, serve(self.create_claim), methods=["POST"]),
            Route(CLAIMS, serve(self.list_claims), methods=get),
            Route(CLAIMS + "/{name}", serve(self.get_claim), methods=get),
            Route(CLAIMS + "/{name}", serve(self.delete_claim), methods=["DELETE"]),
            Route(SANDBOXES, serve(self.list_sandboxes), methods=get),
            Route(SANDBOXES + "/{name}", serve(self.get_sandbox), methods=get),
        ], default=request_response(serve(self.not_served)))

    def _serve(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """The endpoint of `handler`: the caller's tenant from its token, a rollbox error as a `Status`."""

        async def endpoint(request: Request) -> Response:
            try:
                tenant = self.tenants.tenant(request.headers.get("authorization"),
                                             request.headers.get(TENANT_HEADER))
                return await handler(request, tenant)
            except RollboxError as error:
                if error.status >= 500:
                    log.error("Kubernetes API call failed", exc_info=error)
                return json_response(status(error.status, _REASONS.get(error.status, "InternalError"), str(error)),
                                     error.status)

        return endpoint

    async def not_served(self, request: Request, tenant: str) -> Response:
        raise NotFound(f"the server could not find the requested resource: rollbox serves agent-sandbox's "
                       f"SandboxClaims and Sandboxes only, not {request.method} {request.url.path}")

    async def core_versions(self, request: Request, tenant: str) -> Response:
        """Kubernetes discovery: the core API's versions, none (rollbox serves none of its resources)."""
        return json_response({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []})

    async def api_groups(self, request: Request, tenant: str) -> Response:
        """Kubernetes discovery: agent-sandbox's two API groups."""
        groups = [{"name": group, "versions": [{"groupVersion": f"{group}/{VERSION}", "version": VERSION}],
                   "preferredVersion": {"groupVersion": f"{group}/{VERSION}", "version": VERSION}}
                  for group in (SANDBOX_GROUP, CLAIM_GROUP)]
        return json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def sandbox_resources(self, request: Request, tenant: str) -> Response:
        return json_response(_resources(SANDBOX_API, "sandboxes", "Sandbox", ["get", "list", "watch"]))

    async def claim_resources(self, request: Request, tenant: str) -> Response:
        return json_response(_resources(CLAIM_API, "sandboxclaims", "SandboxClaim",
                                        ["create", "delete", "get", "list", "watch"]))

    async def create_claim(self, request: Request, tenant: str) -> Response:
        """Creates a SandboxClaim: claims a sandbox from its warm pool."""
        claim = await self.claims.create(tenant, request.path_params["namespace"], json_object(await request.body()))
        return json_response(claim.as_created(), 201)

    async def list_claims(self, request: Request, tenant: str) -> Response:
        """Lists or watches SandboxClaims (labelSelector, fieldSelector, resourceVersion, timeoutSeconds)."""
        match, namespace = _matcher(request), request.path_params["namespace"]

        async def current() -> list[Entry]:
            return [claim for claim in await self.claims.all(tenant, namespace) if match(claim)]

        return await self._list_or_watch(request, CLAIM_API, "SandboxClaimList", current)

    async def get_claim(self, request: Request, tenant: str) -> Response:
        claim = await self.claims.get(tenant, request.path_params["namespace"], request.path_params["name"])
        return json_response(claim.as_now())

    async def delete_claim(self, request: Request, tenant: str) -> Response:
        """Deletes a SandboxClaim and its sandbox (preconditions.uid honoured)."""
        body = await request.body()
        options = json_object(body) if body.strip() else {}
        uid = (options.get("preconditions") or {}).get("uid")
        claim = await self.claims.delete(tenant, request.path_params["namespace"], request.path_params["name"], uid)
        return json_response(claim.as_now(deleted_at=time.time()))

    async def list_sandboxes(self, request: Request, tenant: str) -> Response:
        """Lists or watches the Sandboxes the tenant's claims are bound to."""
        match, namespace = _matcher(request), request.path_params["namespace"]

        async def current() -> list[Entry]:
            entries = [SandboxEntry(claim.info, claim.pod_ip) for claim in await self.claims.all(tenant, namespace)
                       if claim.info]
            return [entry for entry in entries if match(entry)]

        return await self._list_or_watch(request, SANDBOX_API, "SandboxList", current)

    async def get_sandbox(self, request: Request, tenant: str) -> Response:
        """Reads one Sandbox: its name is the rollbox sandbox id."""
        info = await self.claims.sandbox(tenant, request.path_params["namespace"], request.path_params["name"])
        return json_response(sandbox_object(info, self.claims.pod_ip(tenant, info)))

    async def _list_or_watch(self, request: Request, api_version: str, kind: str,
                             current: Callable[[], Awaitable[list[Entry]]]) -> Response:
        query = request.query_params
        if query.get("watch", "").lower() in ("true", "1"):
            return _watch(current, self.claims, query.get("resourceVersion", ""), query.get("timeoutSeconds", ""),
                          self.started)
        return json_response({"apiVersion": api_version, "kind": kind,
                              "metadata": {"resourceVersion": now_version()},
                              "items": [entry.as_now() for entry in await current()]})


def _resources(group_version: str, plural: str, kind: str, verbs: list[str]) -> dict[str, Any]:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [{"name": plural, "singularName": kind.lower(), "namespaced": True, "kind": kind,
                           "verbs": verbs}]}


def _matcher(request: Request) -> Callable[[Entry], bool]:
    labels = selectors.parse(request.query_params.get("labelSelector"))
    fields = selectors.parse_fields(request.query_params.get("fieldSelector"))
    return lambda entry: labels(entry.labels) and fields({"metadata.name": entry.name,
                                                          "metadata.namespace": entry.namespace})


def _watch(current: Callable[[], Awaitable[list[Entry]]], claims: Claims, since: str, timeout: str,
           started: int) -> Response:
    """Streams watch events, one JSON object a line: from `since` on, or everything as ADDED from "0" (or none).

    A version from before this server started is past what it can replay: an ERROR event with 410, after which
    clients watch again from "0", as from a Kubernetes API server whose history was compacted.
    """
    baseline = _version(since)
    seconds = _seconds(timeout)

    async def events() -> AsyncIterator[bytes]:
        if baseline is not None and baseline < started:
            yield _event("ERROR", status(410, "Expired", f"too old resource version: {baseline} ({started})"))
            return
        deadline = time.monotonic() + seconds
        seen: dict[str, Entry] = {}
        while True:
            try:
                now = {entry.name: entry for entry in await current()}
            except RollboxError as error:
                yield _event("ERROR", status(error.status, _REASONS.get(error.status, "InternalError"), str(error)))
                return
            for name, entry in now.items():
                before = seen.get(name)
                seen[name] = entry
                if before is not None:
                    if before.version != entry.version:
                        yield _event("MODIFIED", entry.as_now())
                elif baseline is None or entry.created_version > baseline:
                    yield _event("ADDED", entry.as_now())
                elif entry.version > baseline:
                    yield _event("MODIFIED", entry.as_now())
            for name in [name for name in seen if name not in now]:
                yield _event("DELETED", seen.pop(name).as_now(deleted_at=time.time()))
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await claims.changed(min(WATCH_POLL, left))

    return StreamingResponse(events(), media_type="application/json")


def _event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def _version(value: str) -> int | None:
    if value in ("", "0"):
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest(f'resourceVersion: Invalid value: "{value}": a resource version this server gave, '
                             'or "0"') from None


def _seconds(value: str) -> float:
    if not value:
        return DEFAULT_WATCH_SECONDS
    try:
        seconds = int(value)
    except ValueError:
        raise InvalidRequest(f'timeoutSeconds: Invalid value: "{value}": a whole number of seconds') from None
    return float(min(max(seconds, 1), MAX_WATCH_SECONDS))

