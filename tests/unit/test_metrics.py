"""The router's Prometheus metrics: the claim counter and histogram read as prometheus_client's own do."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from rollbox.server.metrics import CLAIM_BUCKETS, Metrics


def test_claim_metrics_read_as_a_prometheus_counter_and_histogram() -> None:
    registry = CollectorRegistry()
    claims = Counter("rollbox_claims", "Sandboxes claimed", registry=registry)
    seconds = Histogram("rollbox_claim_seconds", "Time to answer a claim", buckets=CLAIM_BUCKETS, registry=registry)
    metrics = Metrics()
    for value in (0.0, 0.0005, 0.001, 0.0011, 0.003, 0.01, 2.5, 7.0, 20.0):
        claims.inc()
        seconds.observe(value)
        metrics.record_claim(value)
    created = re.compile(r"_created \S+")
    expected = created.sub("_created T", generate_latest(registry).decode())
    exposed = created.sub("_created T", metrics.render({"sandboxes": 0, "claims": 0, "pools": {}}).decode())
    assert exposed.startswith(expected)

