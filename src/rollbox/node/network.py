"""A sandbox's own network: a claim (or, later, its tenant) may narrow the egress its template allows, never widen
it (docs/engine.md, "Network"). The template is the operator's word on what sandboxes of it may reach; a claim can
ask for less (fewer destinations, ports or protocols, or none at all), and the node sets the sandbox's rules to
exactly that. Anything past the template is refused, naming the entry and the template.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from anyio import to_thread

from rollbox.errors import InvalidRequest
from rollbox.models import SandboxInfo
from rollbox.node.claims import as_sandbox
from rollbox.spec import Egress, Network

if TYPE_CHECKING:
    from rollbox.engine import Engine
    from rollbox.node.held import HeldClaims
    from rollbox.node.store import NodeStore


def check_within(template: str, allowed: Network, asked: Network) -> None:
    """Raises, naming the first entry of `asked` that `allowed` (template `template`'s policy) does not cover."""
    if asked.mode == "none":
        return
    for entry in asked.egress:
        if not any(_covers(ceiling, entry) for ceiling in allowed.egress):
            where = f"{entry.cidr or entry.host}" + (f" ports {entry.ports}" if entry.ports else "") + (
                f" ({entry.protocol})" if entry.protocol != "any" else "")
            raise InvalidRequest(f"network egress {where}: template {template!r} does not allow it (its egress: "
                                 f"{_describe(allowed)}); a sandbox may narrow its template's network, never widen "
                                 "it: ask an admin for a template that allows it")


def _covers(ceiling: Egress, entry: Egress) -> bool:
    if ceiling.protocol != "any" and entry.protocol != ceiling.protocol:
        return False
    if ceiling.ports and (not entry.ports or not set(entry.ports) <= set(ceiling.ports)):
        return False
    if entry.host is not None:
        return entry.host == ceiling.host
    if ceiling.cidr is None or entry.cidr is None:
        return False
    return ipaddress.ip_network(entry.cidr).subnet_of(ipaddress.ip_network(ceiling.cidr))  # type: ignore[arg-type]


def _describe(network: Network) -> str:
    return ", ".join(f"{e.cidr or e.host}" + (f":{e.ports}" if e.ports else "") for e in network.egress) or "none"


class NetworkOperations:
    """`LocalNode`'s sandbox networks."""

    engine: Engine
    held: HeldClaims
    store: NodeStore

    async def set_network(self, tenant: str, sandbox_id: str, network: Network) -> SandboxInfo:
        claim = self.held.get(tenant, sandbox_id)
        wanted = network.model_dump(mode="json")

        def apply() -> SandboxInfo:
            with self.held.holding(claim), as_sandbox(claim):
                self._narrow(claim.container_id, wanted)
                claim.network = wanted
                self.store.put_claims([claim])
            return claim.info()

        return await to_thread.run_sync(apply)

    async def _claim_network(self, container_id: str, network: Network | None) -> dict[str, Any] | None:
        """A claim's own network, checked against its template's and set on its container; what the claim keeps."""
        if network is None:
            return None
        wanted = network.model_dump(mode="json")
        await to_thread.run_sync(self._narrow, container_id, wanted)
        return wanted

    def _narrow(self, container_id: str, wanted: dict[str, Any]) -> None:
        """Sets a container's egress to `wanted` (a `Network` as JSON), within its template's."""
        network = Network.model_validate(wanted)
        name = self.engine.info(container_id).template
        check_within(name, self.engine.template(name).spec.network, network)
        self.engine.narrow_network(container_id, network)
