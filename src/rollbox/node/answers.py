"""Who holds a sandbox a claim just made: the answers that carried it, counted, so that one nobody holds ends.

A claim's answer, and each answer of a lookup of its request key (node/keys.py), hands the sandbox to a caller. Each
is settled once sent (`answered`): taken if its caller was still there to read it, not if the caller had hung up. A
sandbox whose answers are all settled and none taken ends at once.

A caller that is there when the answer leaves may still drop it: nginx past its wait on a warm claim, or a router
whose own caller is gone. Such a caller names its call by an attempt id (server/sandboxes.py's `ATTEMPT_HEADER`)
and withdraws the attempt later (`withdraw`), when the node answers again: a withdrawn answer no longer counts as
taken, and one withdrawn before it was settled is settled as not taken. The withdrawn and the taken are remembered
for ATTEMPT_WINDOW; docs/faults.md tells the whole path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cachetools import TTLCache

ATTEMPT_WINDOW = 60.0
"""Seconds an attempt is remembered after the node settled or withdrew it: a withdrawal reaches the node as soon as
it answers again, so only seconds after it settled the answer."""


@dataclass
class _Count:
    pending: int
    """Answers handed out and not yet settled."""
    taken: int
    """Answers settled as taken, less those withdrawn since."""


class Answers:
    """The counts of the sandboxes made under a request key (one answer each; lookups add more), kept `keep_open`
    seconds (as long as their keys count), and the attempts settled as taken or withdrawn. A sandbox without a count
    (a claim without a key) had one answer only. Used on the event loop only."""

    def __init__(self, keep_open: float) -> None:
        self._counts: TTLCache[str, _Count] = TTLCache(math.inf, keep_open)
        self._attempts: TTLCache[str, tuple[str, str] | None] = TTLCache(math.inf, ATTEMPT_WINDOW)
        """Each attempt settled as taken (its tenant and sandbox) or withdrawn (None)."""

    def made(self, sandbox_id: str, answers: int) -> None:
        """A keyed claim made `sandbox_id`: its own answer, and those of the lookups that waited for it, are under
        way."""
        self._counts[sandbox_id] = _Count(answers, 0)

    def sent(self, sandbox_id: str) -> None:
        """A lookup of its key hands `sandbox_id` out once more. One no longer counted (made before a restart, or
        long ago) may be held by whoever its first answer reached."""
        count = self._counts.get(sandbox_id)
        if count is None:
            self._counts[sandbox_id] = _Count(1, 1)
        else:
            count.pending += 1

    def answered(self, tenant: str, sandbox_id: str, taken: bool, attempt: str | None = None) -> bool:
        """One answer carrying `sandbox_id` was sent, to a caller still there (`taken`) or not; whether the sandbox
        now ends (nobody holds it)."""
        if attempt is not None:
            if self._attempts.get(attempt, False) is None:
                taken = False  # withdrawn before it was answered
            elif taken:
                self._attempts[attempt] = (tenant, sandbox_id)
        count = self._counts.get(sandbox_id)
        if count is None:
            return not taken
        count.pending = max(count.pending - 1, 0)
        count.taken += taken
        return self._unheld(sandbox_id, count)

    def withdraw(self, attempts: list[str]) -> list[tuple[str, str]]:
        """The callers of `attempts` dropped their answers: the tenants and sandboxes that then end (nobody holds
        them). An attempt not settled yet is settled as not taken when it is."""
        unheld = []
        for attempt in attempts:
            settled = self._attempts.get(attempt)
            self._attempts[attempt] = None
            if settled is None:
                continue
            count = self._counts.get(settled[1])
            if count is None:
                unheld.append(settled)
                continue
            count.taken = max(count.taken - 1, 0)
            if self._unheld(settled[1], count):
                unheld.append(settled)
        return unheld

    def _unheld(self, sandbox_id: str, count: _Count) -> bool:
        if count.pending or count.taken:
            return False
        self._counts.pop(sandbox_id, None)
        return True
