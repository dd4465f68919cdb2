"""E2B's network settings of a sandbox (`allow_internet_access`, `network={allow_out, deny_out, ...}`,
`update_network`) as rollbox's: a sandbox's own egress allowlist, within its template's (docs/compat-e2b.md).

E2B's sandboxes reach the internet unless told not to; rollbox's reach nothing unless their template says so, and a
sandbox may narrow its template's network but never widen it. So what E2B can say maps as far as an allowlist can:
`allow_out` destinations (addresses, networks, host names) under a `deny_out` of everything are the allowlist;
`allow_internet_access=False`, or a `deny_out` of everything alone, is no network. What an allowlist cannot say (every
destination but some, wildcards of host names, an egress proxy, rewriting requests) is refused, naming the rule, and
so is what the template does not allow (the node checks that).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from pydantic import ValidationError

from rollbox.errors import InvalidRequest
from rollbox.spec import Egress, Network

EVERYWHERE = {"0.0.0.0/0", "0.0.0.0", "::/0"}
UNSUPPORTED = {"egressProxy": "an egress proxy", "rules": "rewriting the sandbox's requests",
               "maskRequestHost": "masking the host of requests to the sandbox", "httpsPorts": "HTTPS to its ports"}


def claim_network(allow_internet_access: bool | None, network: dict[str, Any] | None) -> Network | None:
    """The sandbox's own network for E2B's create request; None where it keeps its template's."""
    settings = dict(network or {})
    if settings.get("allowPublicTraffic") is True:
        raise InvalidRequest("network.allowPublicTraffic: rollbox serves a sandbox's ports to its tenant and to "
                             "holders of its traffic token only (e2b-traffic-access-token); leave it out")
    settings.pop("allowPublicTraffic", None)
    if allow_internet_access is not None:
        settings["allowInternetAccess"] = allow_internet_access
    return egress(settings)


def egress(settings: dict[str, Any]) -> Network | None:
    """`allowOut`, `denyOut` and `allowInternetAccess` (a create's network or an `update_network`) as a policy."""
    for key, what in UNSUPPORTED.items():
        if settings.get(key):
            raise InvalidRequest(f"network.{key}: rollbox does not do {what}: leave it out")
    if settings.get("dnsServers"):
        raise InvalidRequest("network.dnsServers: a rollbox sandbox resolves no names; list addresses or host names "
                             "in allowOut (a host name is resolved by the node when the rule is set)")
    allow = [str(entry) for entry in settings.get("allowOut") or []]
    deny = [str(entry) for entry in settings.get("denyOut") or []]
    internet = settings.get("allowInternetAccess")
    if not allow and not deny and internet is None:
        return None
    partial = [entry for entry in deny if entry not in EVERYWHERE]
    if partial:
        raise InvalidRequest(f"network.denyOut: {partial[0]!r}: rollbox allows listed destinations only, so it cannot "
                             "allow everything but some; deny everything (0.0.0.0/0) and list what to allow in "
                             "allowOut")
    if not allow and (deny or internet is False):
        return Network(mode="none")
    if not allow:  # allowInternetAccess true alone: everywhere, which the template must allow
        return Network(mode="allowlist", egress=[Egress(cidr="0.0.0.0/0")])
    if not deny and internet is not False:
        raise InvalidRequest("network.allowOut: alone it adds to everything E2B allows by default; rollbox allows "
                             "listed destinations only: give denyOut: ['0.0.0.0/0'] with it")
    try:
        return Network(mode="allowlist", egress=[_entry(entry) for entry in allow])
    except ValidationError as error:
        raise InvalidRequest(f"network.allowOut: {error.errors()[0]['msg']}") from None


def _entry(text: str) -> Egress:
    if text.startswith("*"):
        raise InvalidRequest(f"network.allowOut: {text!r}: a wildcard matches names the node cannot resolve ahead "
                             "of time; list each host name")
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return Egress(host=text)
    return Egress(cidr=text)
