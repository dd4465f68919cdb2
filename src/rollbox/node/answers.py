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

import time
from collections import OrderedDict
from dataclasses import dataclass

ATTEMPT_WINDOW = 60.0
"""Seconds an attempt is remembered after the node settled or withdrew it: a withdrawal reaches the node as soon as
it answers again, so only seconds after it settled the answer."""
KEEP_OPEN = 600.0
"""Seconds a keyed sandbox's count is kept: its key may be looked up, and handed out again, that long (KEY_WINDOW)."""


@dataclass
class _Count:
    pending: int
    """Answers handed out and not yet settled."""
    taken: int
    """Answers settled as taken, less those withdrawn since."""
    since: float


class Answers:
    """The counts of the sandboxes made under a request key (one answer each; lookups add more), and the attempts
    settled as taken or withdrawn. A sandbox without a count (a claim without a key) had one answer only. Used on the
    event loop only."""

    def __init__(self) -> None:
        self._counts: OrderedDict[str, _Count] = OrderedDict()
        self._attempts: OrderedDict[str, tuple[tuple[str, str] | None, float]] = OrderedDict()
        """Each attempt settled as taken (its tenant and sandbox) or withdrawn (None), and when; oldest first."""

    def made(self, sandbox_id: str, answers: int) -> None:
        """A keyed claim made `sandbox_id`: its own answer, and those of the lookups that waited for it, are under
        way."""
        now = time.monotonic()
        self._counts[sandbox_id] = _Count(answers, 0, now)
        while self._counts and now - next(iter(self._counts.values())).since > KEEP_OPEN:
            self._counts.popitem(last=False)

    def sent(self, sandbox_id: str) -> None:
        """A lookup of its key hands `sandbox_id` out once more. One no longer counted (made before a restart, or
        long ago) may be held by whoever its first answer reached."""
        count = self._counts.get(sandbox_id)
        if count is None:
            self._counts[sandbox_id] = _Count(1, 1, time.monotonic())
        else:
            count.pending += 1

    def answered(self, tenant: str, sandbox_id: str, taken: bool, attempt: str | None = None) -> bool:
        """One answer carrying `sandbox_id` was sent, to a caller still there (`taken`) or not; whether the sandbox
        now ends (nobody holds it)."""
        if attempt is not None:
            if attempt in self._attempts and self._attempts[attempt][0] is None:
                taken = False  # withdrawn before it was answered
            elif taken:
                self._note(attempt, (tenant, sandbox_id))
        count = self._counts.get(sandbox_id)
        if count is None:
            return not taken
        count.pending = max(count.pending - 1, 0)
        count.taken += taken
        return self._unheld(sandbox_id, count)

    def withdraw(self, attempt: str) -> tuple[str, str] | None:
        """The caller of `attempt` dropped its answer: the tenant and sandbox that then end (nobody holds them), or
        None. An attempt not settled yet is settled as not taken when it is."""
        settled = self._attempts.get(attempt, (None, 0.0))[0]
        self._note(attempt, None)
        if settled is None:
            return None
        count = self._counts.get(settled[1])
        if count is None:
            return settled
        count.taken = max(count.taken - 1, 0)
        return settled if self._unheld(settled[1], count) else None

    def _unheld(self, sandbox_id: str, count: _Count) -> bool:
        if count.pending or count.taken:
            return False
        del self._counts[sandbox_id]
        return True

    def _note(self, attempt: str, settled: tuple[str, str] | None) -> None:
        now = time.monotonic()
        self._attempts[attempt] = (settled, now)
        self._attempts.move_to_end(attempt)
        while self._attempts and now - next(iter(self._attempts.values()))[1] > ATTEMPT_WINDOW:
            self._attempts.popitem(last=False)
