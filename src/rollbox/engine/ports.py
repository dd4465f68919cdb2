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
import ctypes
import errno
import os
import socket
from concurrent.futures import ThreadPoolExecutor

from rollbox.engine.agent_client import AgentClient
from rollbox.engine.runtimes import Runtime
from rollbox.errors import PortClosed, RuntimeUnavailable, SandboxNotRunning

CLONE_NEWNET = 0x40000000
CONNECT_TIMEOUT = 5.0
"""Seconds a connect on the container's loopback may take (it answers at once unless the container is frozen)."""
_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceDialer:
    """Makes sockets inside containers' network namespaces from one thread that enters a namespace only for the
    socket() calls and goes back to the host's at once."""

    def __init__(self) -> None:
        self._host = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollbox-netns")

    async def dial(self, pidfd: int, port: int) -> socket.socket:
        """A socket connected to `port` on the loopback of the namespace of the process `pidfd` names."""
        loop = asyncio.get_running_loop()
        candidates = [(sock, (host, port)) for sock, host in
                      await loop.run_in_executor(self._thread, self._sockets, pidfd)]
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

    def _sockets(self, pidfd: int) -> list[tuple[socket.socket, str]]:
        """Sockets made in the namespace, with the loopback address each dials (IPv4 first)."""
        if _libc.setns(pidfd, CLONE_NEWNET) != 0:
            raise SandboxNotRunning(f"the sandbox's network is gone ({os.strerror(ctypes.get_errno())})")
        made: list[tuple[socket.socket, str]] = []
        try:
            made.append((_nonblocking(socket.AF_INET), "127.0.0.1"))
            with contextlib.suppress(OSError):  # IPv6 may be off in the sandbox
                made.append((_nonblocking(socket.AF_INET6), "::1"))
        finally:
            if _libc.setns(self._host, CLONE_NEWNET) != 0:
                for sock, _ in made:
                    sock.close()
                self._thread.shutdown(wait=False)  # never use a thread stuck in a sandbox's namespace again
                self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollbox-netns")
                raise RuntimeUnavailable("could not return to the host's network namespace after opening a port")
        return made

    def close(self) -> None:
        self._thread.shutdown(wait=False)
        os.close(self._host)


def _nonblocking(family: int) -> socket.socket:
    return socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)


class Ports:
    """Opens ports of the engine's containers, each the way its runtime allows."""

    def __init__(self) -> None:
        self._dialer: NamespaceDialer | None = None

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
        if self._dialer is None:
            self._dialer = NamespaceDialer()
        try:
            return await self._dialer.dial(pidfd, port)
        finally:
            os.close(pidfd)

    def close(self) -> None:
        if self._dialer is not None:
            self._dialer, dialer = None, self._dialer
            dialer.close()
