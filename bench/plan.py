"""How much bench/server.py measures: `--quick` or the full run."""

from __future__ import annotations

from dataclasses import dataclass

CONCURRENCY = (1, 16, 64)
"""Clients of the warm-claim phase, back to back."""


@dataclass(frozen=True)
class Plan:
    """Samples per phase and client: `--quick` keeps the whole run under a minute."""

    pool: int
    """Replicas of the warm pool behind the claim, exec and python phases; a round leaves more than a quarter
    of it, so the pool never runs low enough to refill (and compete for the CPU) while a round is timed."""
    claims: int
    execs: int
    exec_load: int
    python: int
    burst: int
    creates: int
    """Engine create + delete samples: what a cold claim, a refill and the clean-up after an isolated run cost."""
    workers: int
    """Concurrent clients in the throughput phases."""

    @property
    def round(self) -> int:
        """The most claims a round takes (the pool refills at once at a quarter or less)."""
        return self.pool - self.pool // 4 - 1


QUICK = Plan(pool=100, claims=32, execs=200, exec_load=400, python=32, burst=100, creates=10, workers=8)
FULL = Plan(pool=260, claims=576, execs=1000, exec_load=2000, python=192, burst=1000, creates=50, workers=8)


def turnover_clients(plan: Plan) -> int:
    """Clients of the turnover phase: 64, or fewer for a pool too small to serve two steps of them and more."""
    return min(CONCURRENCY[-1], plan.pool // 3)


def room(plan: Plan) -> int:
    """Sandboxes the embedded node may run: a full pool behind the burst, the burst's claims and 64 more."""
    return 2 * plan.burst + 64
