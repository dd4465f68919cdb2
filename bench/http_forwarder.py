"""The floor of a hop written in Python: uvicorn and the router's own connection pool, forwarding each request's bytes
to one node agent as a router does (the cluster secret and the tenant put in, the caller's token left out) and its
answer's bytes back, with no routing, no models and no metrics. bench/cluster.py puts it in front of a node agent
beside the router, so that a run shows what is left of the router's cost once the hop itself is paid.

Run as `python bench/http_forwarder.py LISTEN_PORT NODE_URL SECRET_FILE TENANT` (on 127.0.0.1): it serves until
terminated.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import uvicorn

from http_floor import lifespan
from rollbox.client._http import Settings
from rollbox.client._transport import PoolTransport
from rollbox.server.auth import TENANT_HEADER
from rollbox.server.listen import UVICORN_OPTIONS
from rollbox.server.routing import read_body

HOST = "127.0.0.1"
JSON = [(b"content-type", b"application/json")]


def forwarder(node_url: str, secret: str, tenant: str) -> Any:
    settings = Settings(node_url, secret, 600.0)
    pool = PoolTransport(settings.origin, settings.limits(1024))
    timeouts = settings.timeouts(None)
    headers = {TENANT_HEADER: tenant, "content-type": "application/json"}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        target = scope["raw_path"].decode()
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode()
        body = await read_body(receive)
        reply = await pool.send(settings.written(scope["method"], target, content=body, headers=headers), timeouts)
        answer = await reply.read()
        await send({"type": "http.response.start", "status": reply.status_code,
                    "headers": [*JSON, (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    return app


if __name__ == "__main__":
    port, node_url, secret_file, tenant = sys.argv[1:5]
    app = forwarder(node_url, Path(secret_file).read_text().strip(), tenant)
    uvicorn.Server(uvicorn.Config(app, host=HOST, port=int(port), log_level="warning", **UVICORN_OPTIONS)).run()
