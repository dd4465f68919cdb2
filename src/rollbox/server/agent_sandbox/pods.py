"""agent-sandbox's in-cluster connection (`SandboxInClusterConnectionConfig`): a per-sandbox address that stands for
its pod's IP, served by the router (docs/compat-agent-sandbox.md, "In-cluster connections").

The client reads the pod's IP from the Sandbox's status and sends the runtime API's calls to `http://<ip>:8888`
itself, with no token and no router headers. Here each sandbox claimed through agent-sandbox's API is given an
address of its own on the router machine's loopback (127.x.y.z: all of 127.0.0.0/8 is the machine's own on Linux),
and the router listens on it, port 8888, once the Sandbox's status has been read. A call arriving there is for that
sandbox and acts as its tenant.

Threat model: the address is the credential. Whoever can open a connection to it can run commands in that sandbox
and read and write its files, as whoever can reach a pod's IP can in agent-sandbox. Only processes on the router's
own machine can: its loopback is reachable from no other machine, and from no sandbox (each has its own network
namespace, or gVisor's own stack; an allowlist sandbox's traffic to the host is refused and 127/8 from outside
loopback is dropped by the kernel). So it is opt-in (`rollbox serve --in-cluster-connections`), for machines whose
local processes are the tenant's own (a trainer's host, a Ray cluster on one machine), never for a machine shared
with untrusted users. Without the option the addresses still answer, every call with 403 and the change to make,
so the client's failure says what to do instead of reading as a network fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections import OrderedDict
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.server import ServerState

from rollbox.models import SandboxInfo
from rollbox.server.agent_sandbox.objects import namespace_of
from rollbox.server.responses import json_response

log = logging.getLogger("rollbox.server")

POD_NETWORK = ipaddress.IPv4Network("127.128.0.0/9")
"""Where the addresses come from: the upper half of the machine's loopback network, clear of 127.0.0.1."""
RUNTIME_PORT = 8888
"""The port agent-sandbox's runtime server listens on (`SandboxInClusterConnectionConfig.server_port`)."""
MAX_ADDRESSES = 4096
"""Addresses a router serves at most; the least recently given out goes first."""
TENANT_KEY = "rollbox.tenant"
"""Where a pod address's call carries its tenant in the ASGI scope (no client can set it)."""
REFUSAL = ("in-cluster connections are off on this rollbox: start it with `rollbox serve --in-cluster-connections` "
           "(docs/compat-agent-sandbox.md says who can then reach a sandbox), or connect through the router with "
           "SandboxDirectConnectionConfig(api_url=<the router's URL>, extra_headers={'Authorization': "
           "'Bearer <token>'})")


@dataclass(frozen=True)
class Pod:
    tenant: str
    sandbox_id: str
    namespace: str


class PodAddresses:
    """The addresses of this router's sandboxes and the listeners on them, serving `app` (the data plane)."""

    def __init__(self, app: ASGIApp, enabled: bool) -> None:
        self.app = app
        self.enabled = enabled
        self._pods: OrderedDict[str, Pod] = OrderedDict()
        self._by_sandbox: dict[str, str] = {}
        self._servers: dict[str, asyncio.AbstractServer] = {}
        self._next = 1
        self._config: uvicorn.Config | None = None
        self._state = ServerState()

    def address(self, tenant: str, info: SandboxInfo) -> str:
        """The sandbox's pod IP, listened on from now (once the event loop runs the listener's start)."""
        found = self._by_sandbox.get(info.id)
        if found is not None:
            self._pods.move_to_end(found)
            return found
        address = self._free()
        self._pods[address] = Pod(tenant, info.id, namespace_of(info))
        self._by_sandbox[info.id] = address
        while len(self._pods) > MAX_ADDRESSES:
            self.forget(next(iter(self._pods.values())).sandbox_id)
        with contextlib.suppress(RuntimeError):  # no running loop (a test rendering objects): nobody to serve
            asyncio.get_running_loop().create_task(self._listen(address))
        return address

    def forget(self, sandbox_id: str) -> None:
        """Stops serving a sandbox's address (deleted, or the oldest of too many)."""
        address = self._by_sandbox.pop(sandbox_id, None)
        if address is None:
            return
        self._pods.pop(address, None)
        server = self._servers.pop(address, None)
        if server is not None:
            server.close()

    async def close(self) -> None:
        for sandbox_id in list(self._by_sandbox):
            self.forget(sandbox_id)

    def _free(self) -> str:
        while True:
            index, self._next = self._next, self._next % (POD_NETWORK.num_addresses - 2) + 1
            address = str(POD_NETWORK.network_address + index)
            if address not in self._pods:
                return address

    async def _listen(self, address: str) -> None:
        """A listener on the address, served by uvicorn's own protocol with `_serve` as its app."""
        if self._config is None:
            self._config = uvicorn.Config(self._serve, interface="asgi3", log_level="warning", access_log=False,
                                          lifespan="off",
                                          proxy_headers=False, server_header=False)
            self._config.load()
        config, state = self._config, self._state
        try:
            sock = socket.create_server((address, RUNTIME_PORT), backlog=256)
            server = await asyncio.get_running_loop().create_server(
                lambda: config.http_protocol_class(config=config, server_state=state, app_state={}), sock=sock)
        except OSError as error:
            log.warning("cannot serve the pod address %s:%s: %s", address, RUNTIME_PORT, error)
            return
        if address in self._pods:
            self._servers[address] = server
        else:  # forgotten meanwhile
            server.close()

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        pod = self._pods.get((scope.get("server") or ("", 0))[0])
        if pod is None or not self.enabled:
            message = REFUSAL if pod is not None else "this address serves no sandbox any more: read its Sandbox again"
            await json_response({"detail": message}, 403 if pod is not None else 404)(scope, receive, send)
            return
        headers = [(key, value) for key, value in scope["headers"] if not key.startswith(b"x-sandbox-")]
        headers += [(b"x-sandbox-id", pod.sandbox_id.encode()), (b"x-sandbox-namespace", pod.namespace.encode())]
        await self.app({**scope, "headers": headers, TENANT_KEY: pod.tenant}, receive, send)


