"""deploy/grafana and deploy/prometheus against what a live server exposes: every metric the rules and the
dashboard read is one the server's /metrics has, and every recorded series the dashboard reads is recorded."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rollbox.client import SandboxClient
from rollbox.errors import SandboxNotFound
from tests.support.servers import ADMINS, TEMPLATE, TOKENS, router

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "rollbox-rules.yaml"
DASHBOARD = DEPLOY / "grafana" / "rollbox-dashboard.json"
RAW_METRIC = re.compile(r"\b(rollbox_[a-z0-9_]+)")
RECORDED = re.compile(r"\b([a-z_]+:rollbox_[a-z0-9_]+:[a-z0-9_]+)")
"""Recorded series follow Prometheus's level:metric:operations naming."""
POOL = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {name: basic-pool}
spec: {replicas: 1, sandboxTemplateRef: {name: basic}}
"""


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The sample names a live server's /metrics carries once it has claimed, run a command, and failed a call."""
    with router(tmp_path_factory.mktemp("metrics"), TOKENS, ADMINS) as url, \
            SandboxClient(url, TOKENS["alice"]) as client:
        client.apply(TEMPLATE)
        client.apply(POOL)
        sandbox = client.create_sandbox(template="basic")
        sandbox.run("true")
        sandbox.delete()
        with pytest.raises(SandboxNotFound):
            client.get_sandbox("no-such-sandbox")
        transport = httpx.HTTPTransport(uds=url.removeprefix("unix://"))
        with httpx.Client(transport=transport, base_url="http://rollbox") as http:
            text = http.get("/metrics").text
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [variable["query"]["query"] for variable in dashboard["templating"]["list"]
              if isinstance(variable.get("query"), dict)]
    return exprs


def test_the_recording_rules_read_only_metrics_the_server_exposes(exposed: set[str]) -> None:
    read = {name for rule in rules() for name in RAW_METRIC.findall(rule["expr"])}
    assert read, "the rules read no rollbox metric"
    assert read <= exposed, f"the rules read metrics the server does not expose: {sorted(read - exposed)}"
    for rule in rules():
        assert RECORDED.fullmatch(rule["record"]), f"{rule['record']}: name it level:metric:operations"
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["record"]


def test_the_grafana_dashboard_reads_exposed_metrics_and_recorded_series(exposed: set[str]) -> None:
    recorded = {rule["record"] for rule in rules()}
    exprs = dashboard_exprs()
    read = {name for expr in exprs for name in RAW_METRIC.findall(RECORDED.sub("", expr))}
    assert read <= exposed, f"the dashboard reads metrics the server does not expose: {sorted(read - exposed)}"
    used = {name for expr in exprs for name in RECORDED.findall(expr)}
    assert used <= recorded, f"the dashboard reads series no rule records: {sorted(used - recorded)}"
    for name in ("rollbox_claim_seconds_bucket", "rollbox_exec_seconds_bucket", "rollbox_pool_ready"):
        assert name in exposed, f"the server stopped exposing {name}"


def test_a_renamed_metric_would_be_caught(exposed: set[str]) -> None:
    """The check is not vacuous: a name the server does not expose is found missing."""
    assert "rollbox_claim_seconds_bucket" in exposed
    assert "rollbox_claim_latency_bucket" not in exposed
    assert RAW_METRIC.findall("rate(rollbox_claim_latency_bucket[5m])") == ["rollbox_claim_latency_bucket"]
