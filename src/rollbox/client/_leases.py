"""Leases in the SDK (docs/faults.md): `with client.lease(ttl=60):` opens a lease, renews it in the background every
`ttl / BEATS` seconds, and closes it on exit; the client's claims meanwhile are made under it, so that they end
when the lease does: closed, or no longer renewed because the trainer died.

The lease's id is the client's own (a random one), so any router of a cluster renews it on every node: nothing about
it lives in a router.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from rollbox import errors
from rollbox._logs import throttled
from rollbox.client import _calls as calls
from rollbox.client._call import Call
from rollbox.models import LeaseInfo, LeaseRef

log = logging.getLogger("rollbox.client")

DEFAULT_TTL = 60.0
"""Seconds a lease lasts unless renewed."""
BEATS = 3
"""Renewals per `ttl`: two may fail (the router restarting) before the lease runs out."""


def new_ref(ttl: float, lease_id: str | None) -> LeaseRef:
    return LeaseRef(id=lease_id or f"lease-{secrets.token_hex(12)}", ttl=ttl)


class Lease:
    """A lease of the blocking client, renewed from a thread of its own while open. Thread-safe."""

    def __init__(self, send: Callable[[Call[Any]], Any], held: list[LeaseRef], ttl: float,
                 lease_id: str | None = None) -> None:
        self.ref = new_ref(ttl, lease_id)
        """What a claim names to be made under it: `create_sandbox(lease=lease.ref)`."""
        self._send = send
        self._held = held
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None

    @property
    def id(self) -> str:
        return self.ref.id

    def open(self) -> Lease:
        """Opens it, and makes it the client's: its claims are made under it until it is closed."""
        self.renew()
        self._held.append(self.ref)
        self._beating = threading.Thread(target=self._beat, name=f"rollbox-lease-{self.id}", daemon=True)
        self._beating.start()
        return self

    def renew(self) -> LeaseInfo:
        """Renews it now: it lasts `ttl` from now on every node."""
        return self._send(calls.renew_lease(self.id, self.ref.ttl))

    def close(self) -> None:
        """Stops renewing it and closes it: every sandbox claimed under it ends."""
        self._stop.set()
        with contextlib.suppress(ValueError):
            self._held.remove(self.ref)
        if self._beating is not None:
            self._beating.join()
        self._send(calls.close_lease(self.id))

    def _beat(self) -> None:
        while not self._stop.wait(self.ref.ttl / BEATS):
            try:
                self.renew()
            except errors.RollboxError as error:  # the router restarting: the next beat tries again
                throttled(log, logging.WARNING, "renewing lease %s failed: %s", self.id, error)

    def __enter__(self) -> Lease:
        return self.open()

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncLease:
    """A lease of the asyncio client, renewed by a task of its own while open."""

    def __init__(self, send: Callable[[Call[Any]], Awaitable[Any]], held: list[LeaseRef], ttl: float,
                 lease_id: str | None = None) -> None:
        self.ref = new_ref(ttl, lease_id)
        self._send = send
        self._held = held
        self._beating: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        return self.ref.id

    async def open(self) -> AsyncLease:
        await self.renew()
        self._held.append(self.ref)
        self._beating = asyncio.create_task(self._beat())
        return self

    async def renew(self) -> LeaseInfo:
        return await self._send(calls.renew_lease(self.id, self.ref.ttl))

    async def close(self) -> None:
        with contextlib.suppress(ValueError):
            self._held.remove(self.ref)
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
        await self._send(calls.close_lease(self.id))

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ref.ttl / BEATS)
            try:
                await self.renew()
            except errors.RollboxError as error:
                throttled(log, logging.WARNING, "renewing lease %s failed: %s", self.id, error)

    async def __aenter__(self) -> AsyncLease:
        return await self.open()

    async def __aexit__(self, *_: object) -> None:
        await self.close()
