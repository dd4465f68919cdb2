"""The HTTP floor: a bare ASGI app that answers every request with one constant claim-sized JSON, served by uvicorn
with the router's options. bench/server.py times it beside the warm claims, with the same client, so that a run
shows what any Python server on this machine costs per answer right then (its speed varies from hour to hour).

Run as `python bench/http_floor.py FD`: it serves on the listening socket FD until terminated.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from rollbox.client._http import Settings
from rollbox.server.listen import UVICORN_OPTIONS, private_listener

ANSWER = (b'{"id":"0123456789abcdef","template":"rollbox-bench","warmpool":"rollbox-bench","tenant":"default",'
          b'"state":"running","created_at":1795417794.26,"expires_at":null,"idle_pause_after":null,'
          b'"snapshot":null,"parent":null,"labels":{}}')
"""As long as a warm claim's answer."""
HEAD = {"type": "http.response.start", "status": 200,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]}
BODY = {"type": "http.response.body", "body": ANSWER}
START_TIMEOUT = 30.0


async def lifespan(receive: Any, send: Any) -> None:
    """Starts and stops at once: a bare app has nothing to set up."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    while (await receive()).get("more_body"):
        pass
    await send(HEAD)
    await send(BODY)


@contextlib.contextmanager
def serving(unix: bool = False) -> Iterator[tuple[str, int]]:
    """The floor in a child process (its own interpreter and CPU time) on a loopback port, or on a unix socket as
    the embedded router listens: (URL, pid)."""
    with private_listener(tcp=not unix) as (listener, url):  # listening before the child starts: no polling
        process = subprocess.Popen([sys.executable, __file__, str(listener.fileno())], pass_fds=[listener.fileno()])
        listener.close()  # the child holds it now: should the child die, the socket refuses at once
        try:
            settings = Settings(url, None, START_TIMEOUT)
            with settings.http_client(1) as http:
                try:  # waits in the backlog until the child serves it; refused at once if the child died
                    http.send(settings.request("GET", "/"))
                except httpx.TransportError as error:
                    raise RuntimeError(f"{Path(__file__).name} did not start serving: {error}") from None
            yield url, process.pid
        finally:
            process.terminate()
            process.wait()


if __name__ == "__main__":
    # socket(fileno=) learns the family (uvicorn's own `fd=` takes any descriptor for a unix socket, and would
    # serve TCP without TCP_NODELAY).
    listening = socket.socket(fileno=int(sys.argv[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning", **UVICORN_OPTIONS)).run(sockets=[listening])
