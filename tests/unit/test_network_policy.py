"""A template's network policy as written: the shorthands it takes, the rules they become, and the field an invalid
one names (the engine tier attacks the policies in force)."""

from __future__ import annotations

from typing import Any

import pytest

from rollbox.engine import network
from rollbox.errors import InvalidResource
from rollbox.spec import Network, parse_resource


@pytest.mark.parametrize(("policy", "error"), [
    ({"mode": "allowlist", "egress": ["10.1.2.3/24"]}, r"spec.network.egress.0.cidr: .*host bits set"),
    ({"mode": "allowlist", "egress": ["fd00::1"]}, r"spec.network.egress.0.cidr: .*IPv6"),
    ({"mode": "allowlist", "egress": ["127.0.0.1"]}, r"spec.network.egress.0.cidr: .*loopback"),
    ({"mode": "allowlist", "egress": [{"cidr": "10.0.0.0/8", "ports": [70000]}]}, r"spec.network.egress.0.ports.0"),
    ({"mode": "allowlist", "egress": [{"host": "not a host"}]}, r"spec.network.egress.0.host"),
    ({"mode": "allowlist", "egress": [{"cidr": "10.0.0.1", "protocol": "icmp"}]}, r"spec.network.egress.0.protocol"),
    ({"mode": "allowlist", "egress": [{"ports": [443]}]}, r"spec.network.egress.0: .*exactly one of"),
    ({"mode": "allowlist"}, r"spec.network: .*at least one egress"),
    ({"mode": "none", "egress": ["10.0.0.1"]}, r"spec.network: .*needs mode: allowlist"),
    ({"mode": "open"}, r"spec.network.mode"),
])
def test_invalid_policies_name_the_field(policy: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidResource, match=error):
        parse_resource({"kind": "SandboxTemplate", "metadata": {"name": "t"}, "spec": {"network": policy}})


def test_policy_shorthands_and_rules() -> None:
    policy = Network.model_validate({"mode": "allowlist", "egress": [
        "10.1.2.3", "10.1.0.0/16", "Example.org.", {"cidr": "10.2.0.0/24", "ports": [443, 80], "protocol": "tcp"},
        {"cidr": "10.3.0.1", "ports": [53]}, {"cidr": "10.4.0.1", "protocol": "udp"}]})
    assert [(entry.cidr, entry.host) for entry in policy.egress[:3]] == [
        ("10.1.2.3/32", None), ("10.1.0.0/16", None), (None, "example.org")]
    assert [network.allow_rules(entry) for entry in policy.egress[3:]] == [
        ["ip daddr 10.2.0.0/24 tcp dport { 80, 443 } accept"],
        ["ip daddr 10.3.0.1/32 meta l4proto { tcp, udp } th dport { 53 } accept"],
        ["ip daddr 10.4.0.1/32 meta l4proto udp accept"]]
    assert Network().mode == "none"
