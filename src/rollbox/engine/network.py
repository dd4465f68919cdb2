"""Egress allowlists: a sandbox's own network namespace, one veth to the host, nftables in between.

A sandbox whose template says `network.mode: allowlist` gets, before its container starts, a named network namespace
(`ip netns add rollbox-<engine>-<sandbox>`) holding `lo` and `eth0`, the inner end of a veth pair whose host end is
`rb<engine><index>`. The pair gets a /30 of the engine's address pool (host end .1, sandbox .2, a default route via
the host end). The host forwards and masquerades that sandbox's traffic to the destinations its template lists
(or fewer, as its claim narrows them) and refuses everything else: other ports, other destinations, the host itself
on any address, and every other sandbox. The rules live in one nftables table per engine (`inet rollbox-<engine>`)
with one chain per sandbox.

The namespace lives as long as the sandbox (reset and restarts keep it). The kernel objects outlive the engine
process but not the machine, like the lease files that describe them (`<run dir>/<sandbox>/network.json`): a
restarted engine keeps those of the sandboxes it adopts and removes every namespace, veth and chain of its own that
no sandbox holds, never another engine's.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollbox.errors import CapacityExceeded, InvalidRequest, RuntimeUnavailable
from rollbox.spec import Egress, Network

DEFAULT_POOL = "10.200.0.0/13"
NETNS_DIR = Path("/run/netns")
LOCK_PATH = Path("/run/rollbox/network.lock")
"""Held while an engine picks a subnet and puts it on a veth: two engines never pick the same one."""
_SUBNET = 4  # addresses per sandbox: a /30
_INDEX_DIGITS = 5  # interface names hold 15 characters: "rb", 8 of the engine id, 5 of the subnet index


@dataclass
class Lease:
    """One sandbox's network as it was set up: enough to remove it or to rebuild its rules."""

    sandbox_id: str
    """The container's id (the lease file's keys outlive the engine, so they keep their first names)."""
    netns: str
    host_if: str
    host_ip: str
    sandbox_ip: str
    rules: list[str]
    """nftables statements (destinations already resolved) that accept the sandbox's allowed traffic."""


class Networks:
    """The allowlist networks of one engine's sandboxes. Thread-safe."""

    def __init__(self, engine_id: str, run_dir: Path, pool: str | None = None) -> None:
        self.engine_id = engine_id
        self.run_dir = run_dir
        self.pool = parse_pool(pool or DEFAULT_POOL)
        self.table = f"rollbox-{engine_id}"
        self.if_prefix = f"rb{engine_id}"
        if len(self.if_prefix) + _INDEX_DIGITS > 15:
            raise InvalidRequest(f"engine id {engine_id!r} is too long for interface names (at most 8 characters)")
        self._lock = threading.Lock()
        self._next = int(hashlib.sha256(engine_id.encode()).hexdigest(), 16) % self._slots()
        """Where the search for a free subnet starts: spread by engine id, then round-robin so that a
        freed address (and replies still in flight to it) does not go to the next sandbox at once."""

    # -- the sandbox's view -----------------------------------------------------------------

    def ensure(self, container_id: str, policy: Network) -> Path | None:
        """The network namespace the sandbox's container joins, made on first use; None for `mode: none`."""
        lease = self.lease(container_id)
        if lease is not None and _intact(lease):
            return NETNS_DIR / lease.netns
        if lease is not None:
            self.release(container_id)
        if policy.mode == "none":
            return None
        rules = [rule for entry in policy.egress for rule in allow_rules(entry)]
        with self._lock:
            lease = self._create(container_id, rules)
        return NETNS_DIR / lease.netns

    def narrow(self, container_id: str, policy: Network) -> None:
        """Replaces the sandbox's egress rules with `policy`'s (no more than its template's: the node checks)."""
        with self._lock:
            lease = self.lease(container_id)
            if lease is None:
                if policy.mode != "none":
                    raise InvalidRequest("this sandbox has no network to narrow: its template's policy is none")
                return
            lease.rules = [rule for entry in policy.egress for rule in allow_rules(entry)]
            _nft(self._plug_rules(lease))  # its chain flushed and filled again, in one transaction
            self._save(lease)

    def lease(self, container_id: str) -> Lease | None:
        try:
            return Lease(**json.loads(self._lease_path(container_id).read_text()))
        except FileNotFoundError:
            return None

    def release(self, container_id: str) -> None:
        """Removes the sandbox's rules, veth pair, namespace and lease (no-op without a lease)."""
        lease = self.lease(container_id)
        if lease is None:
            return
        with self._lock:
            try:
                _nft(self._unplug_rules(lease))
                stale_rules = False
            except RuntimeUnavailable:
                stale_rules = True  # part of them was gone already: rebuild the table from the leases left
            _remove_links([lease.host_if], [lease.netns])
            self._lease_path(container_id).unlink(missing_ok=True)
            if stale_rules or not self._leases():
                self._rebuild()

    def remove_orphans(self, keep: set[str]) -> None:
        """Removes every network of this engine that belongs to no sandbox in `keep`."""
        with self._lock:
            for lease in self._leases():
                if lease.sandbox_id not in keep:
                    _remove_links([lease.host_if], [lease.netns])
                    self._lease_path(lease.sandbox_id).unlink(missing_ok=True)
            leased = {lease.sandbox_id for lease in self._leases()}
            self._remove_unleased(lambda container_id: container_id not in leased)
            self._rebuild()

    # -- set-up -----------------------------------------------------------------------------

    def _create(self, container_id: str, rules: list[str]) -> Lease:
        netns = f"rollbox-{self.engine_id}-{container_id}"
        if (NETNS_DIR / netns).exists():  # a crash half-way through an earlier set-up
            self._remove_unleased(lambda found: found == container_id)
        with _machine_lock():
            index = self._free_index()
            subnet = int(self.pool.network_address) + index * _SUBNET
            lease = Lease(sandbox_id=container_id, netns=netns, host_if=f"{self.if_prefix}{index:05x}",
                          host_ip=str(ipaddress.IPv4Address(subnet + 1)),
                          sandbox_ip=str(ipaddress.IPv4Address(subnet + 2)), rules=rules)
            try:
                self._plug(lease)
            except BaseException:
                self._undo(lease)
                raise
        try:
            _nft(self._skeleton() + self._plug_rules(lease))
            _enable_forwarding()
            self._save(lease)
        except BaseException:
            self._undo(lease)
            raise
        return lease

    def _undo(self, lease: Lease) -> None:
        """Cleans up after a failed set-up without hiding why it failed."""
        with contextlib.suppress(RuntimeUnavailable):
            _remove_links([lease.host_if], [lease.netns])
            self._rebuild()

    def _plug(self, lease: Lease) -> None:
        """Makes the namespace and the veth pair, addresses them and routes the sandbox via the host."""
        host, ipv6 = lease.host_if, Path("/proc/sys/net/ipv6").is_dir()
        _ip([f"netns add {lease.netns}", f"link add {host} type veth peer name eth0 netns {lease.netns}",
             f"link set {host} alias {lease.sandbox_id}", *_no_ipv6(host, ipv6),
             f"addr add {lease.host_ip}/30 dev {host}", f"link set {host} up"])
        _ip(["link set lo up", *_no_ipv6("eth0", ipv6), f"addr add {lease.sandbox_ip}/30 dev eth0",
             "link set eth0 up", f"route add default via {lease.host_ip}"], netns=lease.netns)

    def _free_index(self) -> int:
        """The next /30 of the pool after the last one handed out that no route on the machine touches.

        Routes cover every address any interface has and every subnet any engine (or anything else)
        routes, so a subnet picked under the machine lock collides with nothing.
        """
        slots = self._slots()
        blocked = sorted(_routed_slots(self.pool))
        for origin in (self._next % slots, 0):
            index = origin
            for low, high in blocked:
                if high < index:
                    continue
                if low > index:
                    break
                index = high + 1
            if index < slots:
                self._next = index + 1
                return index
        raise CapacityExceeded(f"no free /30 left in the network pool {self.pool}: delete sandboxes with "
                               "mode allowlist or give the engine a larger pool")

    def _slots(self) -> int:
        return self.pool.num_addresses // _SUBNET

    # -- nftables ---------------------------------------------------------------------------

    def _skeleton(self) -> str:
        """The engine's table and base chains, written so that applying them again changes nothing.

        Into a sandbox's veth only replies pass; out of it only what its own chain accepts; to the
        host itself nothing. Allowed traffic leaves with the host's address (masquerade). Refusals
        answer at once (ICMP admin-prohibited), so a blocked connect fails fast instead of hanging.
        """
        table, sandboxes = f"inet {self.table}", f'"{self.if_prefix}*"'
        refuse = "reject with icmpx type admin-prohibited"
        return "\n".join([
            f"add table {table}",
            f"add map {table} egress {{ type ifname : verdict; }}",
            f"add set {table} sources {{ type ipv4_addr; }}",
            f"add chain {table} forward {{ type filter hook forward priority filter - 10; policy accept; }}",
            f"flush chain {table} forward",
            f"add rule {table} forward oifname {sandboxes} ct state established,related accept",
            f"add rule {table} forward oifname {sandboxes} drop",
            f"add rule {table} forward iifname vmap @egress",
            f"add rule {table} forward iifname {sandboxes} {refuse}",
            f"add chain {table} input {{ type filter hook input priority filter - 10; policy accept; }}",
            f"flush chain {table} input",
            f"add rule {table} input iifname {sandboxes} {refuse}",
            f"add chain {table} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}",
            f"flush chain {table} postrouting",
            f"add rule {table} postrouting ip saddr @sources oifname != {sandboxes} masquerade",
        ]) + "\n"

    def _plug_rules(self, lease: Lease) -> str:
        table, chain = f"inet {self.table}", f"s-{lease.sandbox_id}"
        return "\n".join([
            f"add chain {table} {chain}",
            f"flush chain {table} {chain}",
            f"add rule {table} {chain} ip saddr != {lease.sandbox_ip} drop",
            *(f"add rule {table} {chain} {rule}" for rule in lease.rules),
            f'add element {table} egress {{ "{lease.host_if}" : jump {chain} }}',
            f"add element {table} sources {{ {lease.sandbox_ip} }}",
        ]) + "\n"

    def _unplug_rules(self, lease: Lease) -> str:
        table = f"inet {self.table}"
        return "\n".join([
            f'delete element {table} egress {{ "{lease.host_if}" }}',
            f"delete element {table} sources {{ {lease.sandbox_ip} }}",
            f"delete chain {table} s-{lease.sandbox_id}",
        ]) + "\n"

    def _rebuild(self) -> None:
        """Replaces the table, in one transaction, with the rules of the leases on disk (none: no table)."""
        leases = self._leases()
        if leases:
            _nft(f"add table inet {self.table}\ndelete table inet {self.table}\n" + self._skeleton()
                 + "".join(self._plug_rules(lease) for lease in leases))
        elif shutil.which("nft"):  # best effort: engines that never had an allowlist sandbox need no nftables
            _run(["nft", "delete", "table", "inet", self.table], "")

    # -- bookkeeping ------------------------------------------------------------------------

    def _save(self, lease: Lease) -> None:
        path = self._lease_path(lease.sandbox_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.with_suffix(".tmp").write_text(json.dumps(asdict(lease)))
        path.with_suffix(".tmp").rename(path)

    def _lease_path(self, container_id: str) -> Path:
        return self.run_dir / container_id / "network.json"

    def _leases(self) -> list[Lease]:
        found = []
        for path in self.run_dir.glob("*/network.json"):
            with contextlib.suppress(FileNotFoundError):
                found.append(Lease(**json.loads(path.read_text())))
        return found

    def _remove_unleased(self, unwanted: Callable[[str], bool]) -> None:
        """Removes this engine's veths and namespaces whose sandbox is `unwanted`, lease or not."""
        links = [link["ifname"] for link in _json(["ip", "-j", "link", "show"])
                 if link["ifname"].startswith(self.if_prefix) and unwanted(link.get("ifalias", ""))]
        prefix = f"rollbox-{self.engine_id}-"
        names = [path.name for path in NETNS_DIR.glob(f"{prefix}*") if unwanted(path.name[len(prefix):])]
        _remove_links(links, names)


def allow_rules(entry: Egress) -> list[str]:
    """The nftables matches that accept traffic to one egress entry; hostnames are resolved now."""
    destination = entry.cidr if entry.cidr else "{ " + ", ".join(resolve(entry.host or "")) + " }"
    match = f"ip daddr {destination}"
    ports = ", ".join(str(port) for port in sorted(set(entry.ports)))
    if entry.protocol == "any" and ports:
        match += f" meta l4proto {{ tcp, udp }} th dport {{ {ports} }}"
    elif entry.protocol != "any":
        match += f" {entry.protocol} dport {{ {ports} }}" if ports else f" meta l4proto {entry.protocol}"
    return [f"{match} accept"]


def resolve(host: str) -> list[str]:
    """The IPv4 addresses of `host` according to the host's resolver, now."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise RuntimeUnavailable(f"egress host {host!r} does not resolve on this machine ({error.strerror}): "
                                 "check the name and the host's DNS, or list its address as a cidr") from None
    addresses = sorted({str(info[4][0]) for info in infos})
    if not addresses or any(ipaddress.IPv4Address(address).is_loopback for address in addresses):
        raise InvalidRequest(f"egress host {host!r} resolves to {addresses or 'nothing'}: a sandbox can never "
                             "reach the host's loopback; list a host with a routable address")
    return addresses


def parse_pool(text: str) -> ipaddress.IPv4Network:
    """An engine's address pool: a private IPv4 network of /10 to /30 (one /30 per sandbox)."""
    try:
        pool = ipaddress.IPv4Network(text)
    except ValueError as error:
        raise InvalidRequest(f"network pool {text!r}: {error}; give a private IPv4 network like "
                             f"{DEFAULT_POOL}") from None
    if not pool.is_private or not 10 <= pool.prefixlen <= 30:
        raise InvalidRequest(f"network pool {text!r} must be a private IPv4 network from /10 to /30, "
                             f"like {DEFAULT_POOL}")
    return pool


def _routed_slots(pool: ipaddress.IPv4Network) -> Iterator[tuple[int, int]]:
    """The (first, last) /30 indices of the pool that some route on the machine touches (default routes aside)."""
    base, top = int(pool.network_address), int(pool.broadcast_address)
    for route in _json(["ip", "-j", "-4", "route", "show", "table", "all"]):
        destination = route.get("dst", "default")
        if destination == "default":
            continue
        network = ipaddress.IPv4Network(destination, strict=False)
        first, last = max(int(network.network_address), base), min(int(network.broadcast_address), top)
        if first <= last:
            yield (first - base) // _SUBNET, (last - base) // _SUBNET


def _no_ipv6(interface: str, ipv6: bool) -> list[str]:
    """Keeps the kernel from giving the interface an IPv6 link-local address: the allowlist is IPv4 only."""
    return [f"link set {interface} addrgenmode none"] if ipv6 else []


def _enable_forwarding() -> None:
    """Lets the host route sandbox traffic. Turned on at the first allowlist sandbox and left on:
    by then other engines or services may rely on it (docs/engine.md says so)."""
    path = Path("/proc/sys/net/ipv4/ip_forward")
    if path.read_text().strip() != "1":
        path.write_text("1\n")


def _intact(lease: Lease) -> bool:
    return (NETNS_DIR / lease.netns).exists() and Path("/sys/class/net", lease.host_if).exists()


def _remove_links(links: list[str], namespaces: list[str]) -> None:
    """Deletes veths (both ends at once) and namespaces, whichever still exist, and checks they are gone."""
    commands = [f"link del {name}" for name in links] + [f"netns del {name}" for name in namespaces]
    if commands:
        _ip(commands, check=False)
    left = [name for name in links if Path("/sys/class/net", name).exists()]
    left += [name for name in namespaces if (NETNS_DIR / name).exists()]
    if left:
        raise RuntimeUnavailable(f"could not remove {', '.join(left)}: remove them with `ip link del` or "
                                 "`ip netns del`, or restart the engine to retry")


def _ip(commands: list[str], *, netns: str | None = None, check: bool = True) -> None:
    """Runs `ip` commands as one batch (one process), inside `netns` when given."""
    argv = ["ip", *(["-n", netns] if netns else []), *([] if check else ["-force"]), "-batch", "-"]
    result = _run(argv, "\n".join(commands) + "\n")
    if check and result.returncode != 0:
        raise RuntimeUnavailable(f"setting up a sandbox network failed: {result.stderr.strip()}")


def _nft(script: str) -> None:
    result = _run(["nft", "-f", "-"], script)
    if result.returncode != 0:
        raise RuntimeUnavailable(f"nftables refused the sandbox network rules: {result.stderr.strip()}")


def _json(argv: list[str]) -> list[dict[str, Any]]:
    result = _run(argv, "")
    if result.returncode != 0:
        raise RuntimeUnavailable(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")
    return json.loads(result.stdout or "[]")


def _run(argv: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        package = "nftables" if argv[0] == "nft" else "iproute2"
        raise RuntimeUnavailable(f"{argv[0]} is not installed: network allowlists need it "
                                 f"(apt-get install {package}, or scripts/setup.sh)") from None


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
