"""The calls of an episode's inner loop, forwarded by the router as bytes: a command run, a file read or written.

A router that parses such a call into the API's models, calls its node with the SDK's call and writes the node's
answer out again pays for the models twice over, and that cost more of its CPU than the hop itself
(docs/design-notes.md). The node agent serves the same API: it checks the request and words every answer, errors
included. So for these calls the router needs only the caller's tenant and the sandbox's node, and passes the
request and the answer through as they are. Every other call, and every call while tracing is on (its spans are
made on the model path), goes to the API's routes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from rollbox import tracing
from rollbox.cluster.router import ClusterNode
from rollbox.server.app import Failure
from rollbox.server.auth import Tenants
from rollbox.server.metrics import Metrics
from rollbox.server.routing import header, read_body

PREFIX = "/v1/sandboxes/"
JSON = "application/json"


@dataclass(frozen=True)
class Forwarded:
    """One call forwarded as bytes: the media type of its request body and of a success answer (errors are JSON)."""

    request_type: str | None
    answer_type: str | None
    command: bool = False
    """A command's run, counted and logged as the API's route does (Metrics.record_exec)."""


FORWARDED = {
    ("POST", "exec"): Forwarded(JSON, JSON, command=True),
    ("GET", "files"): Forwarded(None, "application/octet-stream"),
    ("PUT", "files"): Forwarded("application/octet-stream", None),
}
"""By method and the path after the sandbox's id; the routes are in server/sandboxes.py."""


class Forwarding:
    def __init__(self, app: ASGIApp, cluster: ClusterNode, tenants: Tenants, metrics: Metrics, fail: Failure) -> None:
        self.app = app
        self.cluster = cluster
        self.tenants = tenants
        self.metrics = metrics
        self.fail = fail

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = None if scope["type"] != "http" or tracing.on else _forwarded(scope["method"], scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        sandbox_id, call = found
        try:
            tenant = self.tenants.tenant(header(scope, b"authorization"))
            body = await read_body(receive)
            started = time.perf_counter()
            if call.command:
                self.metrics.execs.inc()
            target = scope["raw_path"].decode("latin-1")
            if scope["query_string"]:
                target += "?" + scope["query_string"].decode("latin-1")
            status, answer = await self.cluster.forward(tenant, sandbox_id, scope["method"], target, body,
                                                        call.request_type, _wait(body) if call.command else 0.0)
            if call.command and status == 200:
                self._record(tenant, sandbox_id, body, answer, time.perf_counter() - started)
        except ClientDisconnect:
            return
        except Exception as error:
            await self.fail(error)(scope, receive, send)
            return
        media_type = call.answer_type if 200 <= status < 300 else JSON
        headers = [(b"content-length", str(len(answer)).encode())]
        if media_type is not None and status != 204:
            headers.append((b"content-type", media_type.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def _record(self, tenant: str, sandbox_id: str, body: bytes, answer: bytes, seconds: float) -> None:
        """The command log and the exec histogram, from the request the node accepted and its answer."""
        self.metrics.record_exec(tenant, sandbox_id, json.loads(body)["command"], json.loads(answer)["exit_code"],
                                 seconds)


def _forwarded(method: str, path: str) -> tuple[str, Forwarded] | None:
    """The sandbox's id and the call, for a path `/v1/sandboxes/{id}/{call}` that is forwarded as bytes."""
    if not path.startswith(PREFIX):
        return None
    sandbox_id, _, rest = path[len(PREFIX):].partition("/")
    call = FORWARDED.get((method, rest))
    return None if call is None or not sandbox_id else (sandbox_id, call)


def _wait(body: bytes) -> float | None:
    """How long the node may work on a command beyond the usual timeout: the command's own timeout (None, no
    limit, as the SDK's call waits for a command without one)."""
    try:
        timeout = json.loads(body).get("timeout")
    except (ValueError, AttributeError):
        return 0.0  # the node refuses it at once
    return float(timeout) if isinstance(timeout, int | float) and not isinstance(timeout, bool) else None
