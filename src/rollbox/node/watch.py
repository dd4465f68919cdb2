"""Notices at once when a sandbox's container stops, without polling anything.

A warm sandbox can die while it waits for a claim: the kernel's OOM killer, a template's
`shutdown_after`, someone killing it on the host. A claim must never hand such a sandbox out, and
checking each one on the claim path would cost that path a syscall or a round trip to its agent.
Instead every warm sandbox's pidfd sits in one epoll, and a thread hears of an exit as it happens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import select
import threading
from collections.abc import Callable

log = logging.getLogger("rollbox.node")


class ExitWatch:
    """Calls `on_exit(container_id)`, from its own thread, once a watched container stops.

    A descriptor is closed when its sandbox stops (deleted, reset, killed), so it costs nothing to
    stop watching a sandbox that a claim took: the watch simply ends with the sandbox.
    """

    def __init__(self, on_exit: Callable[[str], None]) -> None:
        _allow_open_files()
        self._on_exit = on_exit
        self._epoll = select.epoll()
        self._stop = os.eventfd(0, os.EFD_CLOEXEC)
        self._epoll.register(self._stop, select.EPOLLIN)
        self._watched: dict[int, str] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rollbox-exit-watch", daemon=True)
        self._thread.start()

    def add(self, container_id: str, fd: int) -> None:
        """Watches `fd` (see Engine.exit_fd), which the watch now owns."""
        with self._lock:
            self._watched[fd] = container_id
            self._epoll.register(fd, select.EPOLLIN)

    def watching(self) -> set[str]:
        """The containers watched now."""
        with self._lock:
            return set(self._watched.values())

    def close(self) -> None:
        """Stops watching and closes every descriptor; closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        os.eventfd_write(self._stop, 1)
        self._thread.join()
        with self._lock:
            for fd in self._watched:
                os.close(fd)
            self._watched.clear()
        self._epoll.close()
        os.close(self._stop)

    def _run(self) -> None:
        while True:
            for fd, _ in self._epoll.poll():
                if fd == self._stop:
                    return
                with self._lock:
                    container_id = self._watched.pop(fd)
                    self._epoll.unregister(fd)
                    os.close(fd)
                try:
                    self._on_exit(container_id)
                except Exception:
                    log.exception("handling the exit of container %s failed", container_id)


def _allow_open_files() -> None:
    """Lifts the soft limit on open files to the hard one (no privilege needed): a node holds a
    descriptor per sandbox, and the usual soft limit of 1024 is below a large node's sandboxes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
