"""Ports inside a node's sandboxes: a connection to a server a sandbox runs, for the router to pass traffic through
(docs/ports.md).

Traffic is use: a connection counts as a call in flight for as long as it is open, so a sandbox with open
connections is never idle, and one paused (by its user, for idleness, or saved to disk in standby) resumes when
traffic arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from anyio import to_thread

from rollbox.node.claims import Claim, as_sandbox

if TYPE_CHECKING:
    from rollbox.engine import Engine
    from rollbox.node.base import PortStream
    from rollbox.node.held import HeldClaims

CHUNK = 1 << 16
"""Bytes a read of a port's connection takes at most."""


class SocketStream:
    """A port's connection over a socket the engine opened; closing it ends the claim's use."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, release: Callable[[], None]
                 ) -> None:
        self._reader, self._writer = reader, writer
        self._release: Callable[[], None] | None = release

    async def read(self) -> bytes:
        try:
            return await self._reader.read(CHUNK)
        except (ConnectionError, OSError):
            return b""

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def write_eof(self) -> None:
        with contextlib.suppress(OSError):
            if self._writer.can_write_eof():
                self._writer.write_eof()

    async def close(self) -> None:
        if self._release is None:
            return
        self._release, release = None, self._release
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()
        release()


class PortOperations:
    """`LocalNode`'s ports: the engine opens the port, the claim counts the connection as use."""

    engine: Engine
    held: HeldClaims

    async def open_port(self, tenant: str, sandbox_id: str, port: int) -> PortStream:
        claim = self.held.get(tenant, sandbox_id)
        with self.held.lock:
            claim.busy += 1
        try:
            if claim.paused:
                await to_thread.run_sync(self._resume_for_traffic, claim)
            with as_sandbox(claim):
                sock = await self.engine.open_port(claim.container_id, port)
            reader, writer = await asyncio.open_connection(sock=sock, limit=CHUNK)
        except BaseException:
            self._done(claim)
            raise
        return SocketStream(reader, writer, lambda: self._done(claim))

    def _resume_for_traffic(self, claim: Claim) -> None:
        with self.held.holding(claim), as_sandbox(claim):
            if claim.paused:
                self.engine.resume(claim.container_id)
                claim.paused = None
                self.held.store.put_claims([claim])

    def _done(self, claim: Claim) -> None:
        with self.held.lock:
            claim.busy -= 1
            claim.last_used = time.monotonic()
