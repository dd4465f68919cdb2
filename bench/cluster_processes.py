"""The processes bench/cluster.py measures: node agents, routers and single-machine servers, each a real `rollbox`
command on a free loopback port with its output in a log file; and what they hold in memory.

Every server takes the same tenant token, so that the single-machine server and a router are reached alike (loopback
TCP, a bearer token): the difference between them is the router's hop and nothing of the client's.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rollbox.server.listen import listen_tcp

ROLLBOX = Path(sys.executable).with_name("rollbox")
SPLICE = Path(__file__).with_name("tcp_splice.py")
FORWARDER = Path(__file__).with_name("http_forwarder.py")
TENANT = "bench"
TOKEN = secrets.token_hex(16)
"""The bench tenant's token on every server of a run; it is an admin, to apply its template and pool."""
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0


@dataclass(frozen=True)
class Child:
    name: str
    url: str
    pid: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def free_port() -> int:
    with listen_tcp("127.0.0.1", 0) as listener:
        return listener.getsockname()[1]


@contextlib.contextmanager
def rollbox(root: Path, name: str, *args: str) -> Iterator[Child]:
    """`rollbox ARGS --host 127.0.0.1 --port P` until the block ends (SIGTERM, then SIGKILL after a minute), once it
    answers /healthz."""
    with serving(root, name, lambda port: [str(ROLLBOX), *args, "--host", "127.0.0.1", "--port", str(port)]) as child:
        yield child


@contextlib.contextmanager
def spliced(root: Path, name: str, upstream: Child) -> Iterator[Child]:
    """bench/tcp_splice.py in front of `upstream`: the same server one process further away."""
    upstream_port = upstream.url.rpartition(":")[2]
    with serving(root, name, lambda port: [sys.executable, str(SPLICE), str(port), upstream_port]) as child:
        yield child


@contextlib.contextmanager
def forwarding(root: Path, name: str, node: Child, secret_file: Path) -> Iterator[Child]:
    """bench/http_forwarder.py in front of the node agent `node`, for the bench tenant: a hop in Python and nothing
    else."""
    with serving(root, name, lambda port: [sys.executable, str(FORWARDER), str(port), node.url, str(secret_file),
                                           TENANT]) as child:
        yield child


@contextlib.contextmanager
def serving(root: Path, name: str, command: Callable[[int], list[str]]) -> Iterator[Child]:
    """`command(port)` running until the block ends (SIGTERM, then SIGKILL after a minute), once /healthz answers on
    that port."""
    port = free_port()
    log = root / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(command(port), stdout=out, stderr=subprocess.STDOUT)
    child = Child(name, f"http://127.0.0.1:{port}", process.pid, log)
    try:
        wait_health(child, process, lambda health: True)
        yield child
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


TOKEN_ARGS = ("--token", f"{TENANT}={TOKEN}", "--admin", TENANT)


def server_args(*args: str) -> list[str]:
    """`rollbox serve ARGS` with the bench tenant's token, as an admin."""
    return ["serve", *args, *TOKEN_ARGS]


@contextlib.contextmanager
def router(root: Path, name: str, node_urls: list[str], secret_file: Path, data_plane: str) -> Iterator[Child]:
    """`rollbox serve --node URL ... --data-plane DATA_PLANE` over `node_urls`, once it counts every node as up."""
    nodes = [arg for url in node_urls for arg in ("--node", url)]
    with rollbox(root, name, *server_args(*nodes, "--secret-file", str(secret_file), "--data-plane",
                                          data_plane)) as child:
        wait_health(child, None, lambda health: sum(node["status"] == "up" for node in health["nodes"].values())
                    == len(node_urls))
        yield child


def wait_health(child: Child, process: subprocess.Popen[bytes] | None, ready: Callable[[dict[str, Any]], bool]) -> None:
    """Waits until `child` answers a health that `ready` accepts."""
    deadline = time.monotonic() + START_TIMEOUT
    with httpx.Client(timeout=2.0) as http:
        while True:
            with contextlib.suppress(httpx.TransportError, ValueError):
                answer = http.get(f"{child.url}/healthz")
                if answer.status_code == 200 and ready(answer.json()):
                    return
            if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} on {child.url} did not get ready; its output:\n{child.output()}")
            time.sleep(0.05)


def edge_worker(router: int) -> int | None:
    """The worker of the nginx a router runs at its edge (rollbox/cluster/edge.py), if it runs one."""
    for master in children(router):
        if Path(f"/proc/{master}/exe").resolve().name == "nginx":
            return next(iter(children(master)), None)
    return None


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def secret_file(root: Path) -> Path:
    path = root / "cluster-secret"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")
