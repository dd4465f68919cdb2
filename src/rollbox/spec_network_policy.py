"""Kubernetes network policies for agent-sandbox's templates: a SandboxTemplate's own `networkPolicy`, and the
`NetworkPolicy` documents (`networking.k8s.io/v1`) in the same file that select its pods, as rollbox's egress
allowlist (docs/compat-agent-sandbox.md).

A sandbox has no pods around it and no resolver: egress maps where it names IP blocks (with TCP or UDP ports), and
a rule that reaches only port 53 (name resolution, to the cluster's DNS or any other) allows nothing, since a
rollbox sandbox resolves no names (an allowlist's host names are resolved by the node). So KubeRay's demo, whose
policy lets its sandboxes out to DNS alone, gives them no network. Anything else a policy says that an allowlist
cannot (pods and namespaces by selector, `except`, named ports, port ranges, ingress rules) is refused, naming it.
Policies add up, as in Kubernetes: a template's network is every egress its own policy and its selecting policies
allow. No policy at all, or no egress rule, is no network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollbox.errors import InvalidResource

POLICY_API = "networking.k8s.io/"
DNS_PORT = 53


@dataclass
class Policy:
    """One NetworkPolicy of the file: which pods it selects, and the egress it allows (rollbox `Egress` entries)."""

    name: str
    selector: dict[str, str]
    """`podSelector.matchLabels`; empty selects every pod."""
    egress: list[dict[str, Any]] = field(default_factory=list)
    used: bool = False
    """Whether it selects a template of the file (one that selects none is refused: it would protect nothing)."""

    def selects(self, labels: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.selector.items())


def network_policies(documents: list[Any], refusals: list[str]) -> tuple[list[Any], list[Policy]]:
    """The documents that are not NetworkPolicies, and the NetworkPolicies read (refusals appended)."""
    kept, policies = [], []
    for document in documents:
        if not (isinstance(document, dict) and document.get("kind") == "NetworkPolicy"
                and str(document.get("apiVersion", "")).startswith(POLICY_API)):
            kept.append(document)
            continue
        name = (document.get("metadata") or {}).get("name", "?")
        where = f"NetworkPolicy {name}: spec"
        try:
            policies.append(_policy(name, document.get("spec") or {}, where, refusals))
        except InvalidResource as error:
            refusals.append(str(error))
    return kept, policies


def _policy(name: str, spec: dict[str, Any], where: str, refusals: list[str]) -> Policy:
    selector = spec.get("podSelector") or {}
    if selector.get("matchExpressions"):
        raise InvalidResource(f"{where}.podSelector.matchExpressions: select the template's pods by matchLabels "
                              "(podTemplate.metadata.labels)")
    types = spec.get("policyTypes") or (["Ingress", "Egress"] if spec.get("egress") else ["Ingress"])
    if "Ingress" in types or spec.get("ingress"):
        refusals.append(f"{where}.policyTypes: Ingress: a sandbox takes traffic only through the router, from its "
                        "tenant or a holder of its traffic token (docs/ports.md): list Egress alone")
    return Policy(name, dict(selector.get("matchLabels") or {}), egress_entries(spec.get("egress"), where, refusals))


def template_network(spec: dict[str, Any], labels: dict[str, str], policies: list[Policy], where: str
                     ) -> dict[str, Any]:
    """A SandboxTemplate's rollbox network: its own policy (unless unmanaged) and the policies selecting its pods."""
    selecting = [policy for policy in policies if policy.selects(labels)]
    management = spec.get("networkPolicyManagement", "Managed")
    if management not in ("Managed", "Unmanaged"):
        raise InvalidResource(f"{where}.networkPolicyManagement: {management!r}: Managed or Unmanaged")
    egress: list[dict[str, Any]] = []
    if management == "Unmanaged":
        if spec.get("networkPolicy"):
            raise InvalidResource(f"{where}.networkPolicy: networkPolicyManagement Unmanaged leaves it unused: give "
                                  "the egress in a NetworkPolicy selecting the pods, or drop Unmanaged")
        if not selecting:
            raise InvalidResource(f"{where}.networkPolicyManagement: Unmanaged, and no NetworkPolicy in this file "
                                  f"selects the template's pods (labels {labels}): add one beside it, or leave "
                                  "networkPolicyManagement out (rollbox enforces a policy either way)")
    else:
        own = spec.get("networkPolicy") or {}
        if not isinstance(own, dict):
            raise InvalidResource(f"{where}.networkPolicy: must be a mapping")
        unknown = sorted(set(own) - {"ingress", "egress"})
        if unknown:
            raise InvalidResource(f"{where}.networkPolicy.{unknown[0]}: not a field of a sandbox's network policy")
        if own.get("ingress"):
            raise InvalidResource(f"{where}.networkPolicy.ingress: a sandbox takes traffic only through the router "
                                  "(docs/ports.md): leave it out")
        refusals: list[str] = []
        egress = egress_entries(own.get("egress"), f"{where}.networkPolicy", refusals)
        if refusals:
            raise InvalidResource("\n".join(refusals))
    for policy in selecting:
        policy.used = True
        egress += policy.egress
    return {"mode": "allowlist", "egress": egress} if egress else {"mode": "none"}


def egress_entries(rules: Any, where: str, refusals: list[str]) -> list[dict[str, Any]]:
    """A policy's egress rules as rollbox `Egress` entries (as data); refusals appended."""
    entries: list[dict[str, Any]] = []
    for index, rule in enumerate(rules or []):
        at = f"{where}.egress[{index}]"
        if not isinstance(rule, dict):
            refusals.append(f"{at}: must be a mapping")
            continue
        try:
            ports = [_port(port, f"{at}.ports[{n}]") for n, port in enumerate(rule.get("ports") or [])]
        except InvalidResource as error:
            refusals.append(str(error))
            continue
        if ports and all(number == DNS_PORT for number, _ in ports):
            continue  # name resolution only: a rollbox sandbox resolves no names, so this allows nothing
        for n, peer in enumerate(rule.get("to") or [{"ipBlock": {"cidr": "0.0.0.0/0"}}]):
            block = peer.get("ipBlock") if isinstance(peer, dict) and set(peer) == {"ipBlock"} else None
            if not isinstance(block, dict) or set(block) != {"cidr"}:
                refusals.append(f"{at}.to[{n}]: only ipBlock.cidr maps (no pod or namespace selectors, no except): "
                                "a sandbox sees no pods; name the addresses")
                continue
            entries += _destinations(block["cidr"], ports)
    return entries


def _destinations(cidr: Any, ports: list[tuple[int, str]]) -> list[dict[str, Any]]:
    if not ports:
        return [{"cidr": cidr}]
    by_protocol: dict[str, list[int]] = {}
    for number, protocol in ports:
        by_protocol.setdefault(protocol, []).append(number)
    return [{"cidr": cidr, "ports": numbers, "protocol": protocol} for protocol, numbers in by_protocol.items()]


def _port(port: Any, where: str) -> tuple[int, str]:
    if not isinstance(port, dict):
        raise InvalidResource(f"{where}: must be a mapping")
    number = port.get("port")
    if not isinstance(number, int) or port.get("endPort") is not None:
        raise InvalidResource(f"{where}.port: a port number (no names, no endPort ranges): list each port")
    protocol = str(port.get("protocol", "TCP")).lower()
    if protocol not in ("tcp", "udp"):
        raise InvalidResource(f"{where}.protocol: {port.get('protocol')!r}: TCP or UDP")
    return number, protocol
