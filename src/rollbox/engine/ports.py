"""A port inside a container, opened for the host: a connected socket to a server listening on the container's
loopback, which the node's router passes HTTP and WebSocket traffic through (docs/ports.md).

A container's network namespace has its loopback only (or an egress allowlist's interface too): nothing outside
can connect in. Two ways in, measured on this machine (docs/ports.md has the figures):

- **runc**: the container's sockets are the kernel's, in its network namespace. A dedicated thread enters that
  namespace (setns on a pidfd of the container's init) only to create the socket, and leaves it at once; the
  socket stays in the namespace it was made in, and the event loop connects it to 127.0.0.1 there. No process of
  the sandbox is involved, and nothing in the sandbox changes.
- **gVisor**: the container's sockets live in gVisor's own network stack, which no host namespace reaches. The
  exec agent dials the port inside the sandbox and relays its bytes over its own connection (agent/port.c).

Either way only the sandbox's loopback is dialled, so this reaches nothing the sandbox's own processes could not,
and the sandbox gains no way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket

from rollbox.engine.agent_client import AgentClient
from rollbox.engine.netns import Namespaces
from rollbox.engine.runtimes import Runtime
from rollbox.errors import PortClosed, SandboxNotRunning

CONNECT_TIMEOUT = 5.0
"""Seconds a connect on the container's loopback may take (it answers at once unless the container is frozen)."""


async def _dial(namespaces: Namespaces, pidfd: int, port: int) -> socket.socket:
    """A socket connected to `port` on the loopback of the namespace of the process `pidfd` names."""
    loop = asyncio.get_running_loop()
    candidates = [(sock, (host, port)) for sock, host in await asyncio.wrap_future(namespaces.inside(pidfd, _sockets))]
    refused: OSError | None = None
    try:
        for sock, address in candidates:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    await loop.sock_connect(sock, address)
            except (OSError, TimeoutError) as error:
                refused = refused or (error if isinstance(error, OSError) else OSError(errno.ETIMEDOUT, ""))
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            candidates.remove((sock, address))
            return sock
    finally:
        for sock, _ in candidates:
            sock.close()
    reason = os.strerror(refused.errno) if refused and refused.errno else "no answer"
    raise PortClosed(f"nothing listens on port {port} in the sandbox ({reason})")


def _sockets() -> list[tuple[socket.socket, str]]:
    """Sockets to make in a namespace, with the loopback address each dials (IPv4 first)."""
    made = [(_nonblocking(socket.AF_INET), "127.0.0.1")]
    with contextlib.suppress(OSError):  # IPv6 may be off in the sandbox
        made.append((_nonblocking(socket.AF_INET6), "::1"))
    return made


def _nonblocking(family: int) -> socket.socket:
    return socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)


class Ports:
    """Opens ports of the engine's containers, each the way its runtime allows."""

    def __init__(self, namespaces: Namespaces) -> None:
        self.namespaces = namespaces

    async def open(self, runtime: Runtime, oci_id: str, agent: AgentClient, port: int) -> socket.socket:
        if not 1 <= port <= 65535:
            raise PortClosed(f"port {port} is not a port: give a number from 1 to 65535")
        if not runtime.joins_netns:
            return await agent.open_port(port, runtime.passes_fds)
        try:
            pidfd = runtime.init_pidfd(oci_id)
        except ProcessLookupError:
            raise SandboxNotRunning("the sandbox has stopped: reset it or claim another") from None
        if pidfd is None:
            return await agent.open_port(port, runtime.passes_fds)
        try:
            return await _dial(self.namespaces, pidfd, port)
        finally:
            os.close(pidfd)
