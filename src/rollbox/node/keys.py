"""Claims by their request key (`ClaimRequest.request_key`), so that a claim sent again answers the sandbox the first
one made, and a claim whose caller hung up before its answer ends rather than run on with nobody holding it.

A key belongs to its tenant, and counts for KEY_WINDOW after its claim was made. While a claim with a key is under
way, a second one with the same key waits for it and answers the same sandbox. A claim whose caller is gone when it
is made (`abandoned`) ends, unless another call was handed the same sandbox meanwhile (a claim sent again, or a
router asking for the key, docs/faults.md): that caller holds it now.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from rollbox.models import SandboxInfo
from rollbox.node.claims import Claim

KEY_WINDOW = 600.0
"""Seconds after a claim is made during which its key, sent again by its tenant, answers the same sandbox."""

Key = tuple[str, str]
"""(tenant, request key)."""


class ClaimKeys:
    """The node's request keys; used on the event loop only. `held` gives the claim of a sandbox id, if still held."""

    def __init__(self, held: Callable[[str], Claim | None]) -> None:
        self._held = held
        self._making: dict[Key, asyncio.Future[SandboxInfo]] = {}
        self._made: OrderedDict[Key, tuple[str, float]] = OrderedDict()
        """Each key's sandbox id and when it was made (monotonic), oldest first."""
        self._handed: set[str] = set()
        """Sandboxes handed to a caller besides the one whose claim made them."""
        self._wanted: set[Key] = set()
        """Keys whose claim under way another caller waits for."""

    def adopt(self, claims: list[Claim]) -> None:
        """The keys of claims a restarted node found, counted from now."""
        now = time.monotonic()
        for claim in claims:
            if claim.request_key:
                self._made[(claim.tenant, claim.request_key)] = (claim.sandbox_id, now)

    async def find(self, tenant: str, key: str) -> SandboxInfo | None:
        """The sandbox the key's claim made (waiting for one under way), or None; whoever gets it holds it now."""
        making = self._making.get((tenant, key))
        if making is not None:
            self._wanted.add((tenant, key))  # handed as it is made, before its own caller may abandon it
            with contextlib.suppress(Exception):  # that claim failed: this one is made anew
                return await asyncio.shield(making)
        made = self._made.get((tenant, key))
        if made is None or time.monotonic() - made[1] > KEY_WINDOW:
            return None
        claim = self._held(made[0])
        if claim is None or claim.tenant != tenant:
            return None
        claim.unconfirmed = 0.0
        self._handed.add(claim.sandbox_id)
        return claim.info()

    @contextlib.contextmanager
    def making(self, tenant: str, key: str) -> Iterator[Callable[[SandboxInfo], None]]:
        """Marks the key's claim under way; the block calls what it yields with the sandbox made."""
        future: asyncio.Future[SandboxInfo] = asyncio.get_running_loop().create_future()
        self._making[(tenant, key)] = future

        def made(info: SandboxInfo) -> None:
            if (tenant, key) in self._wanted:
                self._handed.add(info.id)
            now = time.monotonic()
            self._made[(tenant, key)] = (info.id, now)
            self._made.move_to_end((tenant, key))
            while self._made and now - next(iter(self._made.values()))[1] > KEY_WINDOW:
                self._handed.discard(self._made.popitem(last=False)[1][0])
            future.set_result(info)

        try:
            yield made
        except BaseException as error:
            if not future.done():
                future.set_exception(error if isinstance(error, Exception) else RuntimeError("cancelled"))
                future.exception()  # retrieved: nobody need wait for it
            raise
        finally:
            self._making.pop((tenant, key), None)
            self._wanted.discard((tenant, key))

    def abandoned(self, sandbox_id: str) -> bool:
        """Whether a sandbox whose claim's caller hung up should end: not if another caller was handed it."""
        return sandbox_id not in self._handed
