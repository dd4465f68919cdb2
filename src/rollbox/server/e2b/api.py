"""E2B's REST API for sandboxes (create, list, get, kill, timeout, pause, connect, fork, metrics), over a `Node`.

An E2B template name is a rollbox warm pool of that name when there is one (so creation is a warm claim),
else a template. E2B's sandbox `timeout` is the claim's `shutdown_after`, its `metadata` the claim's labels,
its `envVars` the claim's environment. Errors answer `{"code": <status>, "message"}`, the shape the SDK reads.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollbox._problems import problems
from rollbox.errors import (
    InvalidRequest,
    NodeLost,
    NotFound,
    RollboxError,
    SandboxNotRunning,
    TemplateNotFound,
    UnprocessableBody,
)
from rollbox.models import MAX_FORK, ClaimRequest, SandboxInfo
from rollbox.node import Node
from rollbox.server.e2b.access import Access
from rollbox.server.e2b.network import claim_network, egress
from rollbox.server.routing import json_object
from rollbox.spec import Network

log = logging.getLogger("rollbox.server.e2b")

ENVD_VERSION = "0.6.4"
"""The daemon version the SDK is told: the newest whose features it gates on (stdin, octet-stream uploads)."""
CLIENT_ID = "rollbox"
DEFAULT_TIMEOUT = 300
"""E2B's default sandbox timeout, in seconds: a sandbox created without one is deleted after it."""
NEVER = "9999-12-31T23:59:59Z"
NOW = 0.001
"""The end E2B's `set_timeout(0)` asks for: at once (rollbox's ends are a positive number of seconds away)."""


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class NewSandbox(Body):
    template_id: str = Field(alias="templateID", min_length=1)
    timeout: int = Field(DEFAULT_TIMEOUT, ge=1)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(None, alias="envVars")
    volume_mounts: list[Any] | None = Field(None, alias="volumeMounts")
    auto_pause: bool = Field(False, alias="autoPause")
    """Pause at the timeout instead of being killed (`lifecycle.on_timeout="pause"`)."""
    auto_pause_memory: bool = Field(True, alias="autoPauseMemory")
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None


class Timeout(Body):
    timeout: int = Field(ge=0)
    """Seconds from now; 0 ends the sandbox (or pauses it, as its lifecycle says) at once."""


class ConnectSandbox(Body):
    timeout: int | None = Field(None, ge=1)


class Snapshot(Body):
    name: str | None = None


class Pause(Body):
    memory: bool = True


class Fork(Body):
    count: int = Field(1, ge=1, le=MAX_FORK)


BodyT = TypeVar("BodyT", bound=Body)
Handler = Callable[[Request, str], Awaitable[Response]]


def routes(node: Node, access: Access, domains: tuple[str, ...]) -> list[Route]:
    """The REST routes; `domains`: the router's sandbox domains, the first of which E2B's `get_host` addresses."""

    def api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        return guarded(handler, lambda request: access.tenant(request.headers.get("x-api-key")))

    def created(request: Request, tenant: str, info: SandboxInfo) -> dict[str, Any]:
        return {"templateID": info.warmpool or info.template, "sandboxID": info.id, "clientID": CLIENT_ID,
                "alias": info.warmpool or info.template, "envdVersion": ENVD_VERSION,
                "envdAccessToken": access.token(tenant, info.id), "domain": sandbox_domain(request, domains),
                "trafficAccessToken": access.traffic.token(tenant, info.id)}

    def listed(info: SandboxInfo) -> dict[str, Any]:
        return {"templateID": info.warmpool or info.template, "alias": info.warmpool or info.template,
                "sandboxID": info.id, "clientID": CLIENT_ID, "startedAt": _iso(info.created_at),
                "endAt": _iso(info.expires_at) if info.expires_at else NEVER, "cpuCount": 0, "memoryMB": 0,
                "diskSizeMB": 0, "state": "paused" if info.state == "paused" else "running",
                "envdVersion": ENVD_VERSION, "metadata": info.labels}

    async def claim(tenant: str, name: str, **options: Any) -> SandboxInfo:
        """From the warm pool `name`, else the template `name`, else the tenant's snapshot `name`."""
        try:
            return await node.claim(tenant, ClaimRequest(warmpool=name, **options))
        except NotFound as error:
            if type(error) is not NotFound:  # the pool exists; its template does not
                raise
        try:
            return await node.claim(tenant, ClaimRequest(template=name, **options))
        except TemplateNotFound:
            if not any(snapshot.name == name for snapshot in await node.snapshots(tenant)):
                raise
        return await node.claim(tenant, ClaimRequest(snapshot=name, **options))

    async def create(request: Request, tenant: str) -> Response:
        body = await parse(request, NewSandbox)
        if body.volume_mounts:
            raise InvalidRequest("E2B volume mounts are not served: mount rollbox volumes with rollbox's own API "
                                 "(docs/compat-e2b.md)")
        network = claim_network(body.allow_internet_access, body.network)
        on_timeout = ("pause" if body.auto_pause_memory else "pause_files") if body.auto_pause else "delete"
        # a tag names the template's build: rollbox keeps one, its latest (docs/compat-e2b.md)
        info = await claim(tenant, body.template_id.partition(":")[0], shutdown_after=body.timeout,
                           env=body.env_vars or None, labels=body.metadata or None, on_timeout=on_timeout,
                           **({"network": network} if network is not None else {}))
        return JSONResponse(created(request, tenant, info), 201)

    async def list_sandboxes(request: Request, tenant: str) -> Response:
        """Newest first unless `order=asc`, as E2B lists; `startedAfter` keeps those started then or later."""
        query = request.query_params
        states = set(filter(None, query.get("state", "").split(","))) or {"running", "paused"}
        wanted = dict(parse_qsl(query.get("metadata", "")))
        template = query.get("template")
        after = _moment(query.get("startedAfter"), "startedAfter")
        infos = [info for info in await node.claims(tenant)
                 if ("paused" if info.state == "paused" else "running") in states
                 and all(info.labels.get(key) == value for key, value in wanted.items())
                 and template in (None, info.template, info.warmpool)
                 and (after is None or info.created_at >= after - 1e-6)]
        if query.get("order") != "asc":
            infos.reverse()
        start = int(query["nextToken"]) if query.get("nextToken", "").isdigit() else 0
        limit = int(query["limit"]) if query.get("limit", "").isdigit() and int(query["limit"]) > 0 else len(infos)
        page = infos[start:start + limit]
        headers = {"X-Next-Token": str(start + limit)} if start + limit < len(infos) else {}
        return JSONResponse([listed(info) for info in page], headers=headers)

    async def get_sandbox(request: Request, tenant: str) -> Response:
        info = await node.get(tenant, request.path_params["sandbox_id"])
        detail = {**listed(info), "envdAccessToken": access.token(tenant, info.id),
                  "domain": sandbox_domain(request, domains),
                  "trafficAccessToken": access.traffic.token(tenant, info.id)}
        with contextlib.suppress(NotFound):  # the template is gone: leave its sizes out
            limits = (await node.template(info.template)).spec.get("limits", {})
            detail.update(cpuCount=max(1, round(float(limits.get("cpu", 1)))),
                          memoryMB=_megabytes(limits.get("memory")), diskSizeMB=_megabytes(limits.get("disk")))
        return JSONResponse(detail)

    async def kill(request: Request, tenant: str) -> Response:
        await node.delete(tenant, request.path_params["sandbox_id"])
        return Response(status_code=204)

    async def set_timeout(request: Request, tenant: str) -> Response:
        body = await parse(request, Timeout)
        await node.set_shutdown_after(tenant, request.path_params["sandbox_id"], body.timeout or NOW)
        return Response(status_code=204)

    async def pause(request: Request, tenant: str) -> Response:
        """`memory: false` (E2B's `mode="filesystem"`) keeps the files alone: the sandbox starts afresh over them."""
        body = await parse(request, Pause)
        sandbox_id = request.path_params["sandbox_id"]
        if (await node.get(tenant, sandbox_id)).state == "paused":
            return JSONResponse({"code": 409, "message": f"sandbox {sandbox_id} is already paused"}, 409)
        await node.pause(tenant, sandbox_id, body.memory)
        return Response(status_code=204)

    async def connect(request: Request, tenant: str) -> Response:
        body = await parse(request, ConnectSandbox)
        sandbox_id = request.path_params["sandbox_id"]
        info = await node.get(tenant, sandbox_id)
        resumed = info.state == "paused"
        if resumed:
            info = await node.resume(tenant, sandbox_id)
        if info.state == "stopped":
            raise SandboxNotRunning(f"sandbox {sandbox_id} stopped: kill it and create another")
        if body.timeout and ((resumed and info.expires_at is None) or (info.expires_at is not None
                             and info.expires_at < time.time() + body.timeout)):
            info = await node.set_shutdown_after(tenant, sandbox_id, body.timeout)  # only ever later
        return JSONResponse(created(request, tenant, info), 201 if resumed else 200)

    async def fork(request: Request, tenant: str) -> Response:
        body = await parse(request, Fork)
        children = await node.fork(tenant, request.path_params["sandbox_id"], body.count)
        return JSONResponse([{"sandbox": created(request, tenant, child)} for child in children], 201)

    async def snapshot(request: Request, tenant: str) -> Response:
        body = await parse(request, Snapshot)
        name = body.name or f"snapshot-{secrets.token_hex(6)}"
        await node.snapshot(tenant, request.path_params["sandbox_id"], name)
        return JSONResponse({"snapshotID": name, "names": [name]}, 201)

    async def list_snapshots(request: Request, tenant: str) -> Response:
        query = request.query_params
        found = [{"snapshotID": info.name, "names": [info.name]} for info in await node.snapshots(tenant)
                 if query.get("sandboxID") in (None, info.source) and query.get("name") in (None, info.name)]
        return JSONResponse(found)

    async def delete_snapshot(request: Request, tenant: str) -> Response:
        await node.delete_snapshot(tenant, request.path_params["name"])
        return Response(status_code=204)

    async def update_network(request: Request, tenant: str) -> Response:
        """E2B's `update_network`: the sandbox's egress from now on; no rules at all is its template's again."""
        sandbox_id = request.path_params["sandbox_id"]
        body = json_object(await request.body() or b"{}")
        network = egress(body)
        if network is None:
            info = await node.get(tenant, sandbox_id)
            network = Network.model_validate((await node.template(info.template)).spec.get("network") or {})
        await node.set_network(tenant, sandbox_id, network)
        return Response(status_code=204)

    async def metrics(request: Request, tenant: str) -> Response:
        """One sample, taken now: none when `start`..`end` (whole seconds) ends before now or starts after it."""
        stats = await node.stats(tenant, request.path_params["sandbox_id"])
        now = time.time()
        start, end = (_seconds(request.query_params.get(name), name) for name in ("start", "end"))
        if (start is not None and now < start) or (end is not None and int(now) > end):
            return JSONResponse([])
        return JSONResponse([{"timestamp": _iso(now), "timestampUnix": int(now), "cpuCount": 0,
                              "cpuUsedPct": 0.0, "memUsed": stats.memory_bytes, "memTotal": stats.memory_peak_bytes,
                              "memCache": 0, "diskUsed": stats.disk_bytes, "diskTotal": stats.disk_bytes}])

    one = "/sandboxes/{sandbox_id}"
    return [
        Route("/sandboxes", api(create), methods=["POST"]),
        Route("/v2/sandboxes", api(create), methods=["POST"]),
        Route("/sandboxes", api(list_sandboxes), methods=["GET"]),
        Route("/v2/sandboxes", api(list_sandboxes), methods=["GET"]),
        Route(one, api(get_sandbox), methods=["GET"]),
        Route(one, api(kill), methods=["DELETE"]),
        Route(f"{one}/timeout", api(set_timeout), methods=["POST"]),
        Route(f"{one}/pause", api(pause), methods=["POST"]),
        Route(f"{one}/resume", api(connect), methods=["POST"]),
        Route(f"{one}/connect", api(connect), methods=["POST"]),
        Route(f"/v2{one}/connect", api(connect), methods=["POST"]),
        Route(f"{one}/fork", api(fork), methods=["POST"]),
        Route(f"{one}/metrics", api(metrics), methods=["GET"]),
        Route(f"{one}/network", api(update_network), methods=["PUT"]),
        Route(f"{one}/snapshots", api(snapshot), methods=["POST"]),
        Route("/snapshots", api(list_snapshots), methods=["GET"]),
        Route("/templates/{name}", api(delete_snapshot), methods=["DELETE"]),
    ]


def guarded(handler: Handler, caller: Callable[[Request], str]) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint that calls `handler` with the caller's tenant, answering errors in the shape the SDK reads."""
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request, caller(request))
        except RollboxError as error:
            if error.status >= 500:
                log.error("E2B API call failed", exc_info=error)
            status = 404 if isinstance(error, NodeLost) else error.status
            return JSONResponse({"code": status, "message": str(error)}, status)
    return endpoint


async def not_served(request: Request) -> Response:
    """What the SDK asks of E2B that rollbox does not serve: a JSON error it reads, never a bare page."""
    return JSONResponse({"code": 501, "message": f"{request.method} {request.url.path} is not served by rollbox: "
                                                 "see docs/compat-e2b.md"}, 501)


async def parse(request: Request, model: type[BodyT]) -> BodyT:
    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as error:
        raise UnprocessableBody(f"invalid request: {problems(error, 'body')}") from None


def sandbox_domain(request: Request, domains: tuple[str, ...]) -> str:
    """The domain E2B's `get_host(port)` puts after `{port}-{sandbox_id}.`: the router's own sandbox domain, else
    `localhost` at the port the caller reached the router on (browsers and curl send `*.localhost` home)."""
    configured = [domain for domain in domains if domain != "localhost"]
    if configured:
        return configured[0]
    port = request.url.port
    return f"localhost:{port}" if port else "localhost"


def _moment(text: str | None, name: str) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise InvalidRequest(f"{name}: {text!r} is not an ISO 8601 time") from None


def _seconds(text: str | None, name: str) -> int | None:
    if not text:
        return None
    if not text.lstrip("-").isdigit():
        raise InvalidRequest(f"{name}: {text!r} is not a number of seconds since the epoch")
    return int(text)


def _megabytes(value: Any) -> int:
    return int(value) // 2**20 if isinstance(value, int | float) else 0


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")
