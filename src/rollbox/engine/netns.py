"""Sockets that listen inside a container's network namespace, held by the host's process.

A socket belongs to the network namespace it was made in, whoever holds it later. So a thread of ours
joins the container's namespace (setns on a pidfd of its init), makes and binds a listening socket there,
and leaves; from then on the socket answers connections to that address inside the container, and only
there, while this process serves them (the node's model gateway, docs/gateway.md). Nothing runs in the
container and nothing of the host's network is opened to it. A privileged port keeps the sandbox's own
processes (which have no capabilities) from taking the address first.

It takes a runtime whose containers use the kernel's network namespaces (runc); gVisor keeps its own
network stack inside the sandbox, where a host socket is not seen.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def listen_in(pidfd: int, host: str, port: int, backlog: int = 512) -> socket.socket:
    """A non-blocking TCP socket listening on (host, port) inside the network namespace of `pidfd`'s process."""
    made: list[socket.socket | BaseException] = []

    def make() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(pidfd)
            try:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    listener.bind((host, port))
                    listener.listen(backlog)
                    listener.setblocking(False)
                except BaseException:
                    listener.close()
                    raise
                made.append(listener)
            finally:
                _setns(own)
        except BaseException as error:
            made.append(error)
        finally:
            os.close(own)

    thread = threading.Thread(target=make, name="rollbox-netns")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def _setns(fd: int) -> None:
    """Moves the calling thread (only) into the network namespace `fd` refers to."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")
