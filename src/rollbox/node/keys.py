"""Claims by their request key (`ClaimRequest.request_key`), so that a claim sent again answers the sandbox the first
one made.

A key belongs to its tenant, and counts for KEY_WINDOW after its claim was made. While a claim with a key is under
way, a second one with the same key waits for it and answers the same sandbox. Each answer that hands the sandbox
out is counted (node/answers.py): it ends only if none of them reached a caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterator

from cachetools import TTLCache

from rollbox.models import SandboxInfo
from rollbox.node.answers import Answers
from rollbox.node.claims import Claim

KEY_WINDOW = 600.0
"""Seconds after a claim is made during which its key, sent again by its tenant, answers the same sandbox."""

Key = tuple[str, str]
"""(tenant, request key)."""


class ClaimKeys:
    """The node's request keys; used on the event loop only. `held` gives the claim of a sandbox id, if still held."""

    def __init__(self, held: Callable[[str], Claim | None], answers: Answers) -> None:
        self._held = held
        self._answers = answers
        self._making: dict[Key, asyncio.Future[SandboxInfo]] = {}
        self._made: TTLCache[Key, str] = TTLCache(math.inf, KEY_WINDOW)
        """Each key's sandbox id, for KEY_WINDOW after it was made."""
        self._waiting: dict[Key, int] = {}
        """How many callers wait for each key's claim under way: each is handed its sandbox when it is made."""

    def adopt(self, claims: list[Claim]) -> None:
        """The keys of claims a restarted node found, counted from now."""
        for claim in claims:
            if claim.request_key:
                self._made[(claim.tenant, claim.request_key)] = claim.sandbox_id

    async def find(self, tenant: str, key: str) -> SandboxInfo | None:
        """The sandbox the key's claim made (waiting for one under way), or None: one more answer hands it out."""
        making = self._making.get((tenant, key))
        if making is not None and not making.done():  # one done is counted below, as made
            # counted as the sandbox is made, before its own claim's answer may find nobody and end it
            self._waiting[(tenant, key)] = self._waiting.get((tenant, key), 0) + 1
            with contextlib.suppress(Exception):  # that claim failed: this one is made anew
                return await asyncio.shield(making)
        made = self._made.get((tenant, key))
        claim = None if made is None else self._held(made)
        if claim is None or claim.tenant != tenant:
            return None
        claim.unconfirmed = 0.0
        self._answers.sent(claim.sandbox_id)
        return claim.info()

    @contextlib.contextmanager
    def making(self, tenant: str, key: str) -> Iterator[Callable[[SandboxInfo], None]]:
        """Marks the key's claim under way; the block calls what it yields with the sandbox made."""
        future: asyncio.Future[SandboxInfo] = asyncio.get_running_loop().create_future()
        self._making[(tenant, key)] = future

        def made(info: SandboxInfo) -> None:
            self._answers.made(info.id, 1 + self._waiting.pop((tenant, key), 0))
            self._made[(tenant, key)] = info.id
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
            self._waiting.pop((tenant, key), None)
