"""Attacks on the network: egress over TCP, UDP and DNS, the host's loopback services, abstract sockets.

A sandbox's network namespace has a loopback interface and nothing else. The tests start real
listeners on the host's loopback (TCP, UDP, a DNS server, an abstract unix socket), check from the
host that they answer, and show that the sandbox reaches none of them and has no route anywhere,
while its own loopback works across commands. No packet is ever sent off this machine: routes are
asked for with UDP connect, which sends nothing.
"""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from rollbox.engine import Container
from tests.attacks.attack_support import Neighbour


@dataclass
class HostServices:
    """Listeners on the host's loopback; `received` records every connection or datagram they get."""

    tcp4: int
    tcp6: int | None
    udp: int
    dns: int
    abstract: bytes
    path: str
    """A unix socket on the host's filesystem (gVisor runs with --host-uds=all)."""
    received: list[str] = field(default_factory=list)


def _serve(server: socket.socket, name: str, received: list[str], stop: threading.Event) -> None:
    server.settimeout(0.1)
    while not stop.is_set():
        try:
            if server.type == socket.SOCK_STREAM:
                conn, _ = server.accept()
                conn.close()
            else:
                server.recvfrom(4096)
            received.append(name)
        except (TimeoutError, OSError):
            continue


@pytest.fixture
def host_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostServices]:
    stop = threading.Event()
    servers: list[tuple[socket.socket, str]] = []

    def listen(family: int, kind: int, address: object, name: str) -> socket.socket:
        server = socket.socket(family, kind)
        server.bind(address)
        if kind == socket.SOCK_STREAM:
            server.listen()
        servers.append((server, name))
        return server

    tcp4 = listen(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0), "tcp4").getsockname()[1]
    try:
        tcp6: int | None = listen(socket.AF_INET6, socket.SOCK_STREAM, ("::1", 0), "tcp6").getsockname()[1]
    except OSError:
        tcp6 = None
    udp = listen(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0), "udp").getsockname()[1]
    dns = listen(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0), "dns").getsockname()[1]
    abstract = f"\0rollbox-attack-{secrets.token_hex(6)}".encode()
    listen(socket.AF_UNIX, socket.SOCK_STREAM, abstract, "abstract")
    path = str(tmp_path_factory.mktemp("uds") / "host.sock")
    listen(socket.AF_UNIX, socket.SOCK_STREAM, path, "path")
    services = HostServices(tcp4, tcp6, udp, dns, abstract, path)
    threads = [threading.Thread(target=_serve, args=(server, name, services.received, stop), daemon=True)
               for server, name in servers]
    for thread in threads:
        thread.start()
    try:
        yield services
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for server, _ in servers:
            server.close()


def _reach_host_script(services: HostServices) -> str:
    """A Python program that tries every host service and prints one line per attempt."""
    return f"""python3 - <<'EOF'
import os, socket
def attempt(name, family, kind, address, payload=b"x"):
    s = socket.socket(family, kind)
    s.settimeout(2)
    try:
        s.connect(address)
        if kind == socket.SOCK_DGRAM:
            s.send(payload)
            print(name, "sent")
        else:
            print(name, "REACHED")
    except OSError as error:
        print(name, "errno", error.errno)
    finally:
        s.close()
attempt("tcp4", socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", {services.tcp4}))
if {services.tcp6 is not None}:
    attempt("tcp6", socket.AF_INET6, socket.SOCK_STREAM, ("::1", {services.tcp6 or 0}))
attempt("udp", socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", {services.udp}))
query = bytes.fromhex("abcd01000001000000000000") + b"\\x04pypi\\x03org\\x00\\x00\\x01\\x00\\x01"
attempt("dns", socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", {services.dns}), query)
attempt("abstract", socket.AF_UNIX, socket.SOCK_STREAM, {services.abstract!r})
attempt("path", socket.AF_UNIX, socket.SOCK_STREAM, {services.path!r})
try:
    os.symlink({services.path!r}, "/tmp/host-link.sock")
    os.symlink("{"../" * 24}{services.path.lstrip("/")}", "/tmp/host-rel.sock")
except FileExistsError:
    pass
attempt("path-link", socket.AF_UNIX, socket.SOCK_STREAM, "/tmp/host-link.sock")
attempt("path-rel", socket.AF_UNIX, socket.SOCK_STREAM, "/tmp/host-rel.sock")
EOF"""


@pytest.mark.parametrize("user", [None, "root"], ids=["user", "root"])
def test_host_loopback_services_are_unreachable(box: Container, host_services: HostServices,
                                                user: str | None) -> None:
    """TCP (v4, v6), UDP and DNS on the host's 127.0.0.1, abstract and path unix sockets: none reachable."""
    # First show the listeners work, from the host itself.
    for family, kind, address in ((socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", host_services.tcp4)),
                                  (socket.AF_UNIX, socket.SOCK_STREAM, host_services.abstract),
                                  (socket.AF_UNIX, socket.SOCK_STREAM, host_services.path)):
        with socket.socket(family, kind) as probe:
            probe.connect(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.sendto(b"x", ("127.0.0.1", host_services.udp))
    _wait_for(lambda: {"tcp4", "abstract", "path", "udp"} <= set(host_services.received))
    host_services.received.clear()

    result = box.exec(_reach_host_script(host_services), user=user, timeout=60)
    assert result.exit_code == 0, result
    assert "REACHED" not in result.stdout, result
    # Sending a datagram succeeds locally whatever becomes of it: what counts is that none arrived.
    threading.Event().wait(0.5)
    assert host_services.received == [], f"the host received {host_services.received} from the sandbox"


def _wait_for(condition: object, timeout: float = 5.0) -> None:
    event = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if condition():  # type: ignore[operator]
            return
        event.wait(0.05)
    raise AssertionError("the host's own listeners did not answer the host")


def test_no_route_off_the_sandbox(box: Container) -> None:
    """Only `lo` exists and no route leads anywhere else: egress over TCP, UDP or DNS has nowhere to go."""
    result = box.exec("ls /sys/class/net; tail -n +2 /proc/net/route; getent hosts pypi.org || echo 'no dns'")
    assert result.stdout == "lo\nno dns\n", result
    # UDP connect only asks the routing table (it sends nothing): every destination is unreachable.
    probe = """python3 - <<'EOF'
import socket
for family, address in ((socket.AF_INET, ("192.0.2.1", 53)), (socket.AF_INET, ("10.0.0.1", 443)),
                        (socket.AF_INET6, ("2001:db8::1", 53))):
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.connect(address)
        print(address[0], "ROUTED")
    except OSError as error:
        print(address[0], "errno", error.errno)
EOF"""
    routes = box.exec(probe).stdout
    assert "ROUTED" not in routes and routes.count("errno") == 3, routes


def test_loopback_inside_works_across_commands(box: Container, neighbour: Neighbour) -> None:
    """A server started by one command answers the next over the sandbox's own loopback, and only there."""
    with socket.socket() as free:  # a port nothing on the host listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    token = secrets.token_hex(8)
    start = box.exec(f"mkdir -p /tmp/www && echo {token} > /tmp/www/index.html && "
                     f"(setsid nohup python3 -m http.server {port} --bind 127.0.0.1 --directory /tmp/www "
                     ">/dev/null 2>&1 &) && echo started")
    assert start.stdout == "started\n", start
    fetch = ("python3 -c 'import sys, time, urllib.request\n"
             "for _ in range(100):\n"
             "    try:\n"
             f"        page = urllib.request.urlopen(\"http://127.0.0.1:{port}/\", timeout=2).read().decode()\n"
             "        sys.stdout.write(page)\n"
             "        break\n"
             "    except OSError:\n"
             "        time.sleep(0.1)'")
    assert box.exec(fetch, timeout=60).stdout == f"{token}\n"
    # The same port is closed on the host's loopback and on the neighbour's.
    with socket.socket() as probe, pytest.raises(OSError):
        probe.settimeout(2)
        probe.connect(("127.0.0.1", port))
    other = neighbour.sandbox.exec(fetch.replace("range(100)", "range(3)"), timeout=60)
    assert token not in other.stdout, other
    # An abstract unix socket (per network namespace) is out of the neighbour's and the host's reach too.
    name = f"rollbox-attack-{token}"
    served = box.exec(f"(setsid nohup python3 -c 'import socket, time; s = socket.socket(socket.AF_UNIX); "
                      f"s.bind(b\"\\0{name}\"); s.listen(); time.sleep(600)' >/dev/null 2>&1 &); sleep 1; "
                      "grep -c @" + name + " /proc/net/unix")
    assert served.stdout == "1\n", served
    connect = (f"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(b\"\\0{name}\"); "
               "print(\"REACHED\")'")
    assert "REACHED" in box.exec(connect).stdout
    assert "REACHED" not in neighbour.sandbox.exec(connect).stdout
    with socket.socket(socket.AF_UNIX) as probe, pytest.raises(OSError):
        probe.connect(f"\0{name}".encode())
