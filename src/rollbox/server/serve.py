"""`serve()`: the embedded default, router and node in one process on this machine."""

from __future__ import annotations

import ipaddress
import signal
import threading
from collections.abc import Iterable
from pathlib import Path

import uvicorn

from rollbox.engine import DEFAULT_DATA_DIR, Engine
from rollbox.errors import InvalidRequest
from rollbox.node import LocalNode
from rollbox.server.app import DEFAULT_MAX_BODY, create_app
from rollbox.server.auth import Tenants

KEEP_ALIVE = 75.0
"""Seconds an idle connection stays open: longer than clients' pools keep them, so a request never races a close."""
UVICORN_OPTIONS = {"access_log": False, "timeout_keep_alive": KEEP_ALIVE, "proxy_headers": False,
                   "server_header": False}
"""How every rollbox server runs uvicorn. No proxy-header rewriting (clients reach the router directly) and no
server header: a few microseconds of every request's share of the one event loop."""


def serve(data_dir: str | Path = DEFAULT_DATA_DIR, host: str = "127.0.0.1", port: int = 8080,
          tokens: dict[str, str] | None = None, max_sandboxes: int = 64, *, admins: Iterable[str] = (),
          tenant_quota: int | None = None, max_body: int = DEFAULT_MAX_BODY, log_level: str = "warning") -> None:
    """Serves the HTTP API until interrupted (SIGINT/SIGTERM); sandboxes and claims outlive it.

    `admins` names the tenants whose tokens may change templates and warm pools (open: everyone)."""
    if not tokens and not _loopback(host):
        raise InvalidRequest(f"refusing to listen on {host} without tokens: anyone could run commands. "
                             "Give tokens (--token TENANT=TOKEN) or listen on 127.0.0.1")
    admins = tuple(admins)
    Tenants(tokens, admins)  # a mistake in them fails here, before the data directory is touched
    # uvicorn shuts down gracefully on SIGTERM, then raises it again: exit then, so the node and
    # the engine below still close (the default action would kill the process first).
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)
    engine = Engine(data_dir)
    try:
        node = LocalNode(engine, max_sandboxes=max_sandboxes, tenant_quota=tenant_quota)
        try:
            app = create_app(node, tokens, admins=admins, max_body=max_body)
            uvicorn.run(app, host=host, port=port, log_level=log_level, **UVICORN_OPTIONS)
        finally:
            node.close()
    finally:
        engine.close()


def _exit(*_: object) -> None:
    raise SystemExit(0)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
