"""Claim answers the router or its edge dropped, withdrawn on the nodes that sent them (node/answers.py).

A withdrawal is sent once the node answers again: a frozen node takes it as it thaws, right after the claim it
withdraws; one that does not answer is asked again, with growing pauses, for RETRY_FOR. Attempts for the same node
go together, at most MAX_BATCH to a call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

import httpx

from rollbox._logs import throttled
from rollbox.cluster.remote import RemoteNode
from rollbox.errors import RollboxError

log = logging.getLogger("rollbox.cluster")

RETRY_FOR = 600.0
"""Seconds a node that does not take a withdrawal is asked again: as long as a claim's request key counts there."""
PAUSES = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Seconds between tries, the last repeated."""
MAX_BATCH = 1000


class Withdrawals:
    """Withdrawals on their way, by node URL; used on the router's event loop."""

    def __init__(self, remote: Callable[[str], RemoteNode]) -> None:
        self._remote = remote
        self._waiting: dict[str, list[str]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}

    def add(self, url: str, attempt: str) -> None:
        self._waiting.setdefault(url, []).append(attempt)
        if url not in self._senders:
            self._senders[url] = asyncio.get_running_loop().create_task(self._send(url))

    async def close(self) -> None:
        for sender in list(self._senders.values()):
            sender.cancel()
        await asyncio.gather(*self._senders.values(), return_exceptions=True)

    async def _send(self, url: str) -> None:
        try:
            while attempts := self._waiting.get(url):
                batch = attempts[:MAX_BATCH]
                if await self._sent(url, batch):
                    del attempts[:len(batch)]
                else:
                    throttled(log, logging.WARNING, "node at %s took no withdrawal of %d claim attempts in %.0f s; "
                              "their sandboxes end with their leases or shutdown_after", url, len(attempts), RETRY_FOR)
                    break
        finally:
            self._waiting.pop(url, None)
            del self._senders[url]

    async def _sent(self, url: str, attempts: list[str]) -> bool:
        """Whether the node took them (or refused them for good), trying again while it does not answer."""
        deadline = time.monotonic() + RETRY_FOR
        pauses = itertools.chain(PAUSES, itertools.repeat(PAUSES[-1]))
        while True:
            try:
                await self._remote(url).withdraw(attempts)
                return True
            except RollboxError as error:
                if error.status < 500:  # a bug: tried again, it would be refused again
                    log.warning("node at %s refused a withdrawal: %s", url, error)
                    return True
                failure: Exception = error
            except httpx.TransportError as error:
                failure = error
            if time.monotonic() > deadline:
                return False
            throttled(log, logging.INFO, "node at %s did not take a withdrawal yet: %s", url, failure)
            await asyncio.sleep(next(pauses))
