"""Prometheus metrics, in a registry per app so that several servers can live in one process."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rollbox.server.dashboard.history import Activity

CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.claims = Counter("rollbox_claims", "Sandboxes claimed", registry=self.registry)
        self.claim_seconds = Histogram("rollbox_claim_seconds", "Time to answer a claim", buckets=CLAIM_BUCKETS,
                                       registry=self.registry)
        self.execs = Counter("rollbox_execs", "Commands run", registry=self.registry)
        self.failures = Counter("rollbox_failures", "Requests answered with an error, by error code", ["code"],
                                registry=self.registry)
        self.sandboxes = Gauge("rollbox_sandboxes", "Sandboxes on the node (claimed, warm and starting)",
                               registry=self.registry)
        self.claimed = Gauge("rollbox_claimed_sandboxes", "Sandboxes held by claims", registry=self.registry)
        self.pool_ready = Gauge("rollbox_pool_ready", "Ready sandboxes of a warm pool", ["pool"],
                                registry=self.registry)
        self.pool_starting = Gauge("rollbox_pool_starting", "Sandboxes a warm pool is starting", ["pool"],
                                   registry=self.registry)
        self.exec_seconds = Histogram("rollbox_exec_seconds", "Time to answer a command that ran",
                                      buckets=CLAIM_BUCKETS, registry=self.registry)
        self.activity = Activity()
        """Recent latencies and commands, for the dashboard."""

    def record_claim(self, seconds: float) -> None:
        """One claim, answered in `seconds`."""
        self.claims.inc()
        self.claim_seconds.observe(seconds)
        self.activity.claims.add(seconds)

    def record_exec(self, tenant: str, sandbox_id: str, command: str | list[str], exit_code: int | None,
                    seconds: float) -> None:
        """One command that ran (counted in `execs` as it arrived), answered in `seconds`."""
        self.exec_seconds.observe(seconds)
        self.activity.execs.add(seconds)
        self.activity.commands.add(sandbox_id, tenant, command, exit_code, seconds)

    def render(self, health: dict[str, Any]) -> bytes:
        """The text exposition, with gauges read from the node's health at scrape time."""
        self.sandboxes.set(health["sandboxes"])
        self.claimed.set(health["claims"])
        self.pool_ready.clear()
        self.pool_starting.clear()
        for name, pool in health["pools"].items():
            self.pool_ready.labels(name).set(pool["ready"])
            self.pool_starting.labels(name).set(pool["starting"])
        return generate_latest(self.registry)
