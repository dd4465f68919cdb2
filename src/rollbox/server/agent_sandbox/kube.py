"""The part of the Kubernetes API agent-sandbox's client uses: SandboxClaims (create, get, list, watch, delete),
Sandboxes (get, list, watch), and the discovery documents kubectl reads first.

Errors answer Kubernetes `Status` objects, which the `kubernetes` client raises as `ApiException` with their code.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from starlette.responses import Response, StreamingResponse

from rollbox.errors import InvalidRequest, RollboxError
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
from rollbox.server.responses import json_response
from rollbox.server.routing import Query, Routes

CLAIMS = f"/apis/{CLAIM_GROUP}/{VERSION}/namespaces/{{namespace}}/sandboxclaims"
SANDBOXES = f"/apis/{SANDBOX_GROUP}/{VERSION}/namespaces/{{namespace}}/sandboxes"
WATCH_POLL = 0.5
"""Seconds between a watch's looks at the node; changes made through this router wake it at once."""
DEFAULT_WATCH_SECONDS = 300
MAX_WATCH_SECONDS = 3600
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            409: "AlreadyExists", 410: "Expired", 413: "RequestEntityTooLarge", 422: "Invalid",
            429: "TooManyRequests", 503: "ServiceUnavailable"}
LIST_QUERY = (Query("labelSelector", str, None), Query("fieldSelector", str, None), Query("watch", str, ""),
              Query("resourceVersion", str, ""), Query("timeoutSeconds", str, ""))


class Entry(Protocol):
    """What a watch follows of one object."""

    name: str
    created_version: int
    version: int
    labels: dict[str, str]
    namespace: str

    def as_now(self, deleted_at: float | None = None) -> dict[str, Any]: ...


class SandboxEntry:
    def __init__(self, info: SandboxInfo) -> None:
        self.info, self.name, self.namespace = info, info.id, namespace_of(info)
        self.created_version = version_at(info.created_at)
        self.version = self.created_version + 1
        self.labels = sandbox_object(info)["metadata"]["labels"]

    def as_now(self, deleted_at: float | None = None) -> dict[str, Any]:
        obj = sandbox_object(self.info)
        if deleted_at is not None:
            obj["metadata"]["resourceVersion"] = str(version_at(deleted_at) + 1)
        return obj


def kubernetes_errors(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Answers a rollbox error as a `Status` with its code."""

    @functools.wraps(handler)
    async def answer(**args: Any) -> Response:
        try:
            return await handler(**args)
        except RollboxError as error:
            if error.status >= 500:
                raise
            return json_response(status(error.status, _REASONS.get(error.status, "BadRequest"), str(error)),
                                 error.status)

    return answer


def add_routes(routes: Routes, claims: Claims) -> None:
    started = version_at(time.time())
    add = routes.add

    @add("GET", "/api", answer="application/json")
    async def core_versions(tenant: str) -> Response:
        """Kubernetes discovery: the core API's versions (rollbox serves none of its resources)."""
        return json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})

    @add("GET", "/apis", answer="application/json")
    async def api_groups(tenant: str) -> Response:
        """Kubernetes discovery: agent-sandbox's two API groups."""
        groups = [{"name": group, "versions": [{"groupVersion": f"{group}/{VERSION}", "version": VERSION}],
                   "preferredVersion": {"groupVersion": f"{group}/{VERSION}", "version": VERSION}}
                  for group in (SANDBOX_GROUP, CLAIM_GROUP)]
        return json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    @add("GET", f"/apis/{SANDBOX_GROUP}/{VERSION}", answer="application/json")
    async def sandbox_resources(tenant: str) -> Response:
        """Kubernetes discovery: the Sandbox resource."""
        return json_response(_resources(SANDBOX_API, "sandboxes", "Sandbox", ["get", "list", "watch"]))

    @add("GET", f"/apis/{CLAIM_GROUP}/{VERSION}", answer="application/json")
    async def claim_resources(tenant: str) -> Response:
        """Kubernetes discovery: the SandboxClaim resource."""
        return json_response(_resources(CLAIM_API, "sandboxclaims", "SandboxClaim",
                                        ["create", "delete", "get", "list", "watch"]))

    @add("POST", CLAIMS, body=bytes, answer="application/json", status=201)
    @kubernetes_errors
    async def create_claim(tenant: str, namespace: str, body: bytes) -> Response:
        """Creates a SandboxClaim: claims a sandbox from its warm pool."""
        claim = await claims.create(tenant, namespace, _json(body))
        return json_response(claim.as_created(), 201)

    @add("GET", CLAIMS, answer="application/json", query=LIST_QUERY)
    @kubernetes_errors
    async def list_claims(tenant: str, namespace: str, labelSelector: str | None, fieldSelector: str | None,
                          watch: str, resourceVersion: str, timeoutSeconds: str) -> Response:
        """Lists or watches SandboxClaims (labelSelector, fieldSelector on metadata.name, resourceVersion)."""
        match = _matcher(labelSelector, fieldSelector)

        async def current() -> list[Entry]:
            return [claim for claim in await claims.all(tenant, namespace) if match(claim)]

        if _true(watch):
            return _watch(current, claims, resourceVersion, timeoutSeconds, started)
        return _list(CLAIM_API, "SandboxClaimList", await current())

    @add("GET", CLAIMS + "/{name}", answer="application/json")
    @kubernetes_errors
    async def get_claim(tenant: str, namespace: str, name: str) -> Response:
        """Reads one SandboxClaim."""
        return json_response((await claims.get(tenant, namespace, name)).as_now())

    @add("DELETE", CLAIMS + "/{name}", body=bytes, answer="application/json")
    @kubernetes_errors
    async def delete_claim(tenant: str, namespace: str, name: str, body: bytes) -> Response:
        """Deletes a SandboxClaim and its sandbox (preconditions.uid honoured)."""
        options = _json(body) if body.strip() else {}
        uid = (options.get("preconditions") or {}).get("uid") if isinstance(options, dict) else None
        claim = await claims.delete(tenant, namespace, name, uid)
        return json_response(claim.as_now(deleted_at=time.time()))

    @add("GET", SANDBOXES, answer="application/json", query=LIST_QUERY)
    @kubernetes_errors
    async def list_sandboxes(tenant: str, namespace: str, labelSelector: str | None, fieldSelector: str | None,
                             watch: str, resourceVersion: str, timeoutSeconds: str) -> Response:
        """Lists or watches the Sandboxes the tenant's claims are bound to."""
        match = _matcher(labelSelector, fieldSelector)

        async def current() -> list[Entry]:
            entries = [SandboxEntry(claim.info) for claim in await claims.all(tenant, namespace) if claim.info]
            return [entry for entry in entries if match(entry)]

        if _true(watch):
            return _watch(current, claims, resourceVersion, timeoutSeconds, started)
        return _list(SANDBOX_API, "SandboxList", await current())

    @add("GET", SANDBOXES + "/{name}", answer="application/json")
    @kubernetes_errors
    async def get_sandbox(tenant: str, namespace: str, name: str) -> Response:
        """Reads one Sandbox: its name is the rollbox sandbox id."""
        return json_response(sandbox_object(await claims.sandbox(tenant, namespace, name)))


def _resources(group_version: str, plural: str, kind: str, verbs: list[str]) -> dict[str, Any]:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [{"name": plural, "singularName": kind.lower(), "namespaced": True, "kind": kind,
                           "verbs": verbs}]}


def _json(body: bytes) -> Any:
    try:
        value = json.loads(body)
    except ValueError as error:
        raise InvalidRequest(f"the body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("the body must be a JSON object")
    return value


def _true(value: str) -> bool:
    return value.lower() in ("true", "1")


def _matcher(label_selector: str | None, field_selector: str | None) -> Callable[[Entry], bool]:
    labels, fields = selectors.parse(label_selector), selectors.parse_fields(field_selector)
    return lambda entry: labels(entry.labels) and fields({"metadata.name": entry.name,
                                                          "metadata.namespace": entry.namespace})


def _list(api_version: str, kind: str, entries: list[Entry]) -> Response:
    return json_response({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": now_version()},
                          "items": [entry.as_now() for entry in entries]})


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

