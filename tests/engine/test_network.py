"""Egress allowlists, attacked for real.

The test makes its own "remote host": a network namespace behind a veth, on a 10.198.x.0/24 that no
route on this machine touches, running TCP servers on two ports and UDP echo servers. Sandboxes then
probe it, the host's loopback and the host's veth addresses, and each other. Traffic only ever goes
to loopback and to namespaces made here (the remote's and the sandboxes'); every wait is bounded.
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import select
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollbox.engine import Container, Engine, network
from rollbox.errors import CapacityExceeded, InvalidRequest, InvalidResource
from rollbox.node.network import check_within
from rollbox.spec import Egress, Network, SandboxTemplate
from tests.support.engines import make_engine, teardown_engine, template_for

PORT_A, PORT_B, PORT_UDP, PORT_PEER = 18080, 18081, 15353, 18082

SERVER = textwrap.dedent("""
    import socket, sys, threading, time
    log, lock = open(sys.argv[1], "a", buffering=1), threading.Lock()
    tcp_ports = [int(port) for port in sys.argv[2].split(",")]
    udp_ports = [int(port) for port in sys.argv[3].split(",")]

    def record(line):
        with lock:
            log.write(line + "\\n")

    def tcp(server, port):
        while True:
            conn, peer = server.accept()
            record(f"tcp {port} {peer[0]}")
            conn.sendall(f"hello {port}\\n".encode())
            conn.close()

    def udp(server, port):
        while True:
            data, peer = server.recvfrom(512)
            record(f"udp {port} {peer[0]}")
            server.sendto(b"echo " + data, peer)

    for port in tcp_ports:
        threading.Thread(target=tcp, args=(socket.create_server(("0.0.0.0", port)), port), daemon=True).start()
    for port in udp_ports:
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind(("0.0.0.0", port))
        threading.Thread(target=udp, args=(server, port), daemon=True).start()
    print("ready", flush=True)
    time.sleep(900)
""")

PROBE = textwrap.dedent("""
    import errno, json, socket, sys

    def attempt(kind, host, port):
        if kind == "tcp":
            with socket.create_connection((host, port), timeout=3) as conn:
                conn.settimeout(3)
                return conn.recv(100).decode().strip()
        if kind == "udp":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.settimeout(2)
                sock.connect((host, port))
                sock.send(b"ping")
                return sock.recv(100).decode()
        family, type_, proto = {"raw": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                                "packet": (socket.AF_PACKET, socket.SOCK_RAW, 0),
                                "ping": (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)}[kind]
        socket.socket(family, type_, proto).close()
        return "opened"

    results = []
    for target in json.loads(sys.argv[1]):
        try:
            results.append(attempt(*target))
        except OSError as error:
            results.append(errno.errorcode[error.errno] if error.errno else type(error).__name__)
    print(json.dumps(results))
""")

PEER = textwrap.dedent(f"""
    import socket
    server = socket.create_server(("0.0.0.0", {PORT_PEER}))
    server.settimeout(120)
    while True:
        conn, _ = server.accept()
        conn.sendall(b"peer")
        conn.close()
""")


@dataclass
class Remote:
    netns: str
    host_if: str
    subnet: ipaddress.IPv4Network
    host_ip: str
    """The host's own address on the link to the remote."""
    ip: str
    log: Path

    def events(self) -> list[str]:
        return self.log.read_text().splitlines()


class Listener:
    """A TCP listener on the host that no sandbox may ever reach."""

    def __init__(self, address: str, port: int = 0) -> None:
        self.socket = socket.create_server((address, port))
        self.socket.setblocking(False)
        self.address, self.port = self.socket.getsockname()

    def connections(self) -> int:
        count = 0
        for _ in range(100):
            try:
                self.socket.accept()[0].close()
            except BlockingIOError:
                break
            count += 1
        return count


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.198.x.0/24 that no route on this machine touches: it will exist only in namespaces made here."""
    routes = [ipaddress.IPv4Network(route["dst"], strict=False)
              for route in json.loads(run("ip", "-j", "-4", "route", "show", "table", "all"))
              if route.get("dst", "default") != "default"]
    for _ in range(100):
        candidate = ipaddress.IPv4Network(f"10.198.{secrets.randbelow(256)}.0/24")
        if not any(candidate.overlaps(route) for route in routes):
            return candidate
    raise AssertionError("no free 10.198.x.0/24 on this machine")


def footprint(engine_id: str) -> dict[str, int]:
    """This engine's network namespaces, veths and nftables objects (table, chains, rules, set elements)."""
    netns = len(list(network.NETNS_DIR.glob(f"rollbox-{engine_id}-*")))
    veths = sum(link["ifname"].startswith(f"rb{engine_id}") for link in json.loads(run("ip", "-j", "link", "show")))
    table, nft = f"rollbox-{engine_id}", 0
    for item in json.loads(run("nft", "-j", "list", "ruleset"))["nftables"]:
        ((kind, body),) = item.items()
        if body.get("family") == "inet" and (body.get("table") == table or (kind == "table" and body["name"] == table)):
            nft += 1 + len(body.get("elem", []))
    return {"netns": netns, "veths": veths, "nft": nft}


def probe(box: Container, *targets: tuple[str, str, int], user: str | None = None) -> list[str]:
    """Runs the probes inside the sandbox: each gives what the peer answered, or the errno name."""
    result = box.exec(["python3", "-c", PROBE, json.dumps(targets)], timeout=60, user=user)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def build(engine: Engine, name: str, policy: dict[str, Any], runtime: str = "runc") -> str:
    engine.build(SandboxTemplate.model_validate(
        {"metadata": {"name": name}, "spec": {"runtime": runtime, "network": policy}}))
    return name


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    subnet, tag = free_subnet(), secrets.token_hex(3)
    hosts = list(subnet.hosts())
    log = tmp_path_factory.mktemp("remote") / "events.log"
    log.touch()
    found = Remote(f"rbt-{tag}", f"rbt{tag}", subnet, str(hosts[0]), str(hosts[1]), log)
    run("ip", "netns", "add", found.netns)
    server = None
    try:
        run("ip", "link", "add", found.host_if, "type", "veth", "peer", "name", "eth0", "netns", found.netns)
        for prefix, interface, address in (([], found.host_if, found.host_ip), (["-n", found.netns], "eth0", found.ip)):
            run("ip", *prefix, "link", "set", interface, "addrgenmode", "none")
            run("ip", *prefix, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", interface)
            run("ip", *prefix, "link", "set", interface, "up")
        run("ip", "-n", found.netns, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", found.netns, sys.executable, "-c", SERVER, str(log),
             f"{PORT_A},{PORT_B}", f"{PORT_UDP},{PORT_B}"], stdout=subprocess.PIPE, text=True)
        assert server.stdout and select.select([server.stdout], [], [], 15)[0], "the remote server did not start"
        assert server.stdout.readline().strip() == "ready"
        yield found
    finally:
        if server:
            server.kill()
            server.wait(timeout=10)
        subprocess.run(["ip", "link", "del", found.host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", found.netns], capture_output=True, timeout=30)


def allowlist_for(remote: Remote, engine: Engine) -> dict[str, Any]:
    """Port A of the remote's network (which holds a host address too), UDP to the remote's echo
    port, and a port on the whole engine pool (which holds every other sandbox)."""
    return {"mode": "allowlist", "egress": [
        {"cidr": str(remote.subnet), "ports": [PORT_A], "protocol": "tcp"},
        {"cidr": remote.ip, "ports": [PORT_UDP], "protocol": "udp"},
        {"cidr": str(engine.networks.pool), "ports": [PORT_PEER], "protocol": "tcp"},
    ]}


@pytest.fixture(scope="module")
def allowlist(engine: Engine, remote: Remote) -> str:
    return build(engine, "net-allowlist", allowlist_for(remote, engine))


def test_only_the_allowed_port_is_reachable(engine: Engine, remote: Remote, allowlist: str) -> None:
    with engine.create(allowlist) as box:
        seen = len(remote.events())
        assert probe(box, ("tcp", remote.ip, PORT_A), ("tcp", remote.ip, PORT_B)) == [
            f"hello {PORT_A}", "EHOSTUNREACH"]
        # The remote saw one connection, from the host's address on its link (masqueraded), none on B.
        assert remote.events()[seen:] == [f"tcp {PORT_A} {remote.host_ip}"]


def test_the_host_is_unreachable_on_every_address(engine: Engine, remote: Remote, allowlist: str) -> None:
    with engine.create(allowlist) as box:
        lease = engine.networks.lease(box.id)
        assert lease is not None
        loopback = Listener("127.0.0.1")
        gateway = [Listener(lease.host_ip, port) for port in (PORT_A, PORT_B)]
        in_allowed_network = Listener(remote.host_ip, PORT_A)  # allowed cidr and port, but the host's own
        listeners = [loopback, *gateway, in_allowed_network]
        try:
            with socket.create_connection(("127.0.0.1", loopback.port), timeout=3):
                pass  # the control: the host reaches its own listener
            assert loopback.connections() == 1
            assert probe(box, ("tcp", "127.0.0.1", loopback.port), ("tcp", lease.host_ip, PORT_A),
                         ("tcp", lease.host_ip, PORT_B), ("tcp", remote.host_ip, PORT_A),
                         ("udp", lease.host_ip, PORT_B)) == [
                "ECONNREFUSED", "EHOSTUNREACH", "EHOSTUNREACH", "EHOSTUNREACH", "EHOSTUNREACH"]
            assert [listener.connections() for listener in listeners] == [0, 0, 0, 0]
        finally:
            for listener in listeners:
                listener.socket.close()


def test_udp_goes_only_where_allowed(engine: Engine, remote: Remote, allowlist: str) -> None:
    with engine.create(allowlist) as box:
        seen = len(remote.events())
        assert probe(box, ("udp", remote.ip, PORT_UDP), ("udp", remote.ip, PORT_B), ("udp", remote.ip, PORT_A)) == [
            "echo ping", "EHOSTUNREACH", "EHOSTUNREACH"]
        assert remote.events()[seen:] == [f"udp {PORT_UDP} {remote.host_ip}"]


@pytest.mark.parametrize("user", [None, "root"])
def test_raw_and_packet_sockets_stay_impossible(engine: Engine, allowlist: str, user: str | None) -> None:
    with engine.create(allowlist) as box:
        assert probe(box, ("raw", "", 0), ("packet", "", 0), ("ping", "", 0), user=user) == [
            "EPERM", "EPERM", "EACCES"]


def test_the_sandbox_has_one_ipv4_interface_and_no_ipv6(engine: Engine, allowlist: str) -> None:
    with engine.create(allowlist) as box:
        lease = engine.networks.lease(box.id)
        assert lease is not None
        devices = box.exec("tail -n +3 /proc/net/dev | cut -d: -f1", timeout=10).stdout.split()
        assert sorted(devices) == ["eth0", "lo"]
        assert box.exec("cat /proc/net/if_inet6", timeout=10).stdout.split()[-1:] == ["lo"]
        address = box.exec(["python3", "-c", f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                                             f"s.connect(('{lease.host_ip}', 9)); print(s.getsockname()[0])"],
                           timeout=10)  # connect() on UDP sends nothing: it only picks the source address
        assert address.stdout.strip() == lease.sandbox_ip


def test_a_default_sandbox_reaches_nothing(engine: Engine, remote: Remote, runtime: str) -> None:
    with engine.create(template_for(runtime)) as box:
        seen = len(remote.events())
        results = probe(box, ("tcp", remote.ip, PORT_A), ("udp", remote.ip, PORT_UDP))
        assert set(results) <= {"ENETUNREACH", "EHOSTUNREACH"}, results  # gVisor says the latter
        assert box.exec("tail -n +3 /proc/net/dev | cut -d: -f1", timeout=10).stdout.split() == ["lo"]
        assert remote.events()[seen:] == []
        assert engine.networks.lease(box.id) is None


def test_sandboxes_cannot_reach_each_other(engine: Engine, allowlist: str) -> None:
    with engine.create(allowlist) as first, engine.create(allowlist) as second:
        first.exec('python3 -c "$PEER" >/dev/null 2>&1 &', env={"PEER": PEER}, timeout=10)
        for _ in range(50):
            if probe(first, ("tcp", "127.0.0.1", PORT_PEER)) == ["peer"]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the peer server in the first sandbox did not start")
        first_lease, second_lease = engine.networks.lease(first.id), engine.networks.lease(second.id)
        assert first_lease and second_lease
        assert probe(first, ("tcp", first_lease.sandbox_ip, PORT_PEER)) == ["peer"]  # the control: it listens there
        # The allowlist covers the whole pool on that port, yet nothing new may enter a sandbox.
        assert probe(second, ("tcp", first_lease.sandbox_ip, PORT_PEER)) == ["TimeoutError"]
        assert probe(first, ("tcp", second_lease.sandbox_ip, PORT_PEER)) == ["TimeoutError"]


def test_hostnames_are_resolved_on_the_host_at_creation(engine: Engine, remote: Remote,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo
    names = {"remote.rollbox.test": remote.ip, "loopback.rollbox.test": "127.0.0.1"}

    def resolve(host: str, *args: Any, **kwargs: Any) -> Any:  # no DNS traffic: names of this test only
        if host in names:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[host], 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(network.socket, "getaddrinfo", resolve)
    by_name = build(engine, "net-by-name", {"mode": "allowlist", "egress": [{"host": "remote.rollbox.test",
                                                                            "ports": [PORT_A]}]})
    with engine.create(by_name) as box:
        assert probe(box, ("tcp", remote.ip, PORT_A), ("tcp", remote.ip, PORT_B)) == [
            f"hello {PORT_A}", "EHOSTUNREACH"]
    before = footprint(engine.id)
    to_loopback = build(engine, "net-to-loopback", {"mode": "allowlist", "egress": ["loopback.rollbox.test"]})
    with pytest.raises(InvalidRequest, match="never reach the host's loopback"):
        engine.create(to_loopback)
    assert footprint(engine.id) == before


def test_delete_reset_and_fork_leave_nothing_behind(engine: Engine, remote: Remote, allowlist: str) -> None:
    before = footprint(engine.id)
    box = engine.create(allowlist)
    lease = engine.networks.lease(box.id)
    box.reset()
    assert engine.networks.lease(box.id) == lease, "reset keeps the sandbox's network"
    children = box.fork(2)
    family = [box, *children]
    leases = [engine.networks.lease(sandbox.id) for sandbox in family]
    assert len({found.sandbox_ip for found in leases if found}) == 3
    for sandbox in family:
        assert probe(sandbox, ("tcp", remote.ip, PORT_A)) == [f"hello {PORT_A}"]
    during = footprint(engine.id)
    assert (during["netns"], during["veths"]) == (before["netns"] + 3, before["veths"] + 3)
    for sandbox in family:
        sandbox.delete()
    assert footprint(engine.id) == before


def test_recover_removes_this_engines_leftovers_and_no_other(engine: Engine, remote: Remote, allowlist: str,
                                                              tmp_path: Path) -> None:
    before = footprint(engine.id)
    other = make_engine(tmp_path)
    try:
        theirs = other.create(build(other, "net-other", allowlist_for(remote, other)))
        mine = engine.create(allowlist)
        their_lease, my_lease = other.networks.lease(theirs.id), engine.networks.lease(mine.id)
        assert their_lease and my_lease and their_lease.sandbox_ip != my_lease.sandbox_ip
        engine.store.delete_container(mine.id)  # the engine forgot it, the machine did not
        engine.recover()
        assert footprint(engine.id) == before
        assert other.networks.lease(theirs.id) == their_lease
        assert probe(theirs, ("tcp", remote.ip, PORT_A)) == [f"hello {PORT_A}"]
    finally:
        teardown_engine(other)
    assert footprint(other.id) == {"netns": 0, "veths": 0, "nft": 0}


def test_subnets_avoid_every_route_and_each_other(tmp_path: Path, remote: Remote) -> None:
    policy = Network(mode="allowlist", egress=[Egress(cidr=remote.ip)])
    routed = network.Networks("0badbeef", tmp_path / "routed", str(remote.subnet))
    with pytest.raises(CapacityExceeded, match="no free /30"):
        routed.ensure("blocked", policy)  # the remote's link route covers the whole pool
    pool = ipaddress.IPv4Network(f"{free_subnet().network_address}/29")  # room for two sandboxes
    first = network.Networks("0badcafe", tmp_path / "first", str(pool))
    second = network.Networks("0badf00d", tmp_path / "second", str(pool))
    try:
        first.ensure("one", policy)
        second.ensure("two", policy)
        leases = [first.lease("one"), second.lease("two")]
        assert sorted(lease.sandbox_ip for lease in leases if lease) == [str(pool[2]), str(pool[6])]
        with pytest.raises(CapacityExceeded):
            first.ensure("three", policy)
    finally:
        for networks in (routed, first, second):
            networks.remove_orphans(set())
    for engine_id in ("0badbeef", "0badcafe", "0badf00d"):
        assert footprint(engine_id) == {"netns": 0, "veths": 0, "nft": 0}


def test_runsc_allowlists_are_refused_with_a_clear_error(engine: Engine) -> None:
    with pytest.raises(InvalidResource, match=r"spec.network: mode allowlist .* use runtime runc"):
        build(engine, "net-runsc", {"mode": "allowlist", "egress": ["10.198.0.1"]}, runtime="runsc")
    assert "net-runsc" not in engine.templates()


def test_a_sandbox_narrows_its_templates_network_and_nothing_more(engine: Engine, remote: Remote) -> None:
    """A claim's own network (or E2B's update_network) replaces its chain: fewer ports, then none at all."""
    both = build(engine, "net-both-ports", {"mode": "allowlist", "egress": [
        {"cidr": str(remote.subnet), "ports": [PORT_A, PORT_B], "protocol": "tcp"}]})
    with engine.create(both) as box:
        assert probe(box, ("tcp", remote.ip, PORT_A), ("tcp", remote.ip, PORT_B)) == [
            f"hello {PORT_A}", f"hello {PORT_B}"]
        engine.narrow_network(box.id, Network(mode="allowlist", egress=[
            Egress(cidr=remote.ip, ports=[PORT_A], protocol="tcp")]))
        assert probe(box, ("tcp", remote.ip, PORT_A), ("tcp", remote.ip, PORT_B)) == [
            f"hello {PORT_A}", "EHOSTUNREACH"]
        engine.narrow_network(box.id, Network(mode="none"))
        assert probe(box, ("tcp", remote.ip, PORT_A)) == ["EHOSTUNREACH"]
        assert engine.networks.lease(box.id).rules == []  # kept for a restart, as the chain now is
    with engine.create("basic") as closed, pytest.raises(InvalidRequest, match="no network to narrow"):
        engine.narrow_network(closed.id, Network(mode="allowlist", egress=[Egress(cidr=remote.ip)]))


def test_a_sandbox_may_ask_for_no_more_than_its_template() -> None:
    template = Network(mode="allowlist", egress=[Egress(cidr="10.9.0.0/16", ports=[443], protocol="tcp"),
                                                 Egress(host="pypi.org")])
    check_within("t", template, Network(mode="none"))
    check_within("t", template, Network(mode="allowlist", egress=[Egress(cidr="10.9.1.0/24", ports=[443],
                                                                         protocol="tcp"), Egress(host="pypi.org")]))
    for wider, named in ((Egress(cidr="10.0.0.0/8", ports=[443], protocol="tcp"), "10.0.0.0/8"),
                         (Egress(cidr="10.9.1.0/24", ports=[80], protocol="tcp"), "ports [80]"),
                         (Egress(cidr="10.9.1.0/24"), "10.9.1.0/24"),
                         (Egress(cidr="10.9.1.0/24", ports=[443], protocol="udp"), "(udp)"),
                         (Egress(host="example.com"), "example.com")):
        with pytest.raises(InvalidRequest, match=re.escape(named)):
            check_within("t", template, Network(mode="allowlist", egress=[wider]))
