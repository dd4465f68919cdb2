"""Sockets made inside a container's network namespace and held by the host's process.

A socket belongs to the network namespace it was made in, whoever holds it later. So one thread of ours enters
a container's namespace (setns on a pidfd of its init) only for the calls that make a socket, and goes back to
the host's at once; from then on the socket listens or connects inside the container, and only there, while this
process uses it: the node's model gateway listens at a sandbox's own address (docs/gateway.md), the router's port
traffic connects to a server on its loopback (docs/ports.md). Nothing runs in the container and nothing of the
host's network is opened to it.

It takes a runtime whose containers use the kernel's network namespaces (runc); gVisor keeps its own network
stack inside the sandbox, where a host socket is not seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from rollbox.errors import RuntimeUnavailable, SandboxNotRunning

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


class Namespaces:
    """The one thread that makes sockets inside containers' network namespaces."""

    def __init__(self) -> None:
        self._host = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollbox-netns")

    def inside(self, pidfd: int, make: Callable[[], T]) -> Future[T]:
        """Runs `make` in the network namespace of the process `pidfd` names, on the namespace thread."""
        return self._thread.submit(self._made, pidfd, make)

    def listen(self, pidfd: int, host: str, port: int, backlog: int = 512) -> socket.socket:
        """A non-blocking TCP socket listening on (host, port) inside the namespace."""

        def make() -> socket.socket:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((host, port))
                listener.listen(backlog)
                listener.setblocking(False)
            except BaseException:
                listener.close()
                raise
            return listener

        return self.inside(pidfd, make).result()

    def _made(self, pidfd: int, make: Callable[[], T]) -> T:
        if _libc.setns(pidfd, CLONE_NEWNET) != 0:
            raise SandboxNotRunning(f"the sandbox's network is gone ({os.strerror(ctypes.get_errno())})")
        try:
            return make()
        finally:
            if _libc.setns(self._host, CLONE_NEWNET) != 0:
                self._thread.shutdown(wait=False)  # never use a thread stuck in a sandbox's namespace again
                self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollbox-netns")
                raise RuntimeUnavailable("could not go back to the host's network namespace after making a socket")

    def close(self) -> None:
        self._thread.shutdown(wait=False)
        with contextlib.suppress(OSError):
            os.close(self._host)
