"""Writing claims as they are made and deleted, one transaction per event-loop turn."""

from __future__ import annotations

import asyncio

from rollbox.node.claims import Claim
from rollbox.node.store import NodeStore


class ClaimWriter:
    """Records the claims made and deleted during one event-loop turn in one transaction.

    The commit is the costliest step of a warm claim; under a burst (many clients claiming at once)
    it is paid once per loop turn instead of once per claim. A claim (or a deletion) answers only
    once written, so what a client was told survives a crash of the server.
    """

    def __init__(self, store: NodeStore) -> None:
        self.store = store
        self._claims: list[Claim] = []
        self._deleted: list[Claim] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def put(self, claim: Claim) -> None:
        self._claims.append(claim)
        await self._written()

    async def delete(self, claim: Claim) -> None:
        self._deleted.append(claim)
        await self._written()

    def _written(self) -> asyncio.Future[None]:
        if not self._waiting:  # the batch's first: its loop flushes it (asking for the loop costs a syscall)
            self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._flush)
        future = self._loop.create_future()
        self._waiting.append(future)
        return future

    def _flush(self) -> None:
        claims, deleted, waiting = self._claims, self._deleted, self._waiting
        self._claims, self._deleted, self._waiting = [], [], []
        try:
            self.store.put_claims(claims, deleted)
        except Exception as error:
            for future in waiting:
                if not future.done():
                    future.set_exception(error)
            return
        for future in waiting:
            if not future.done():
                future.set_result(None)
