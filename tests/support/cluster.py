"""A cluster on one machine without Ray: node agents (`rollbox node`) and routers (`rollbox serve --node URL`), each a
real process on a free loopback port, each node on a data directory of its own. Closing it stops every process with
SIGTERM, runs `rollbox down` on every data directory and checks nothing of any engine is left on the machine."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx

from rollbox.client import Sandbox, SandboxClient
from rollbox.engine import Engine
from tests.support.engines import leftovers, teardown_engine
from tests.support.servers import wait_until_serving

ROLLBOX = Path(sys.executable).with_name("rollbox")
TOKENS = {"alice": "alice-token", "bob": "bob-token"}
ADMINS = ("alice",)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 0.05) -> Any:
    """`condition()` once it is true (a minute at most)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(every)
    return value


@dataclass
class Process:
    """One `rollbox` process, its output kept in a log file for the assertion messages."""

    args: list[str]
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.spawn()
        self.wait_serving()

    def spawn(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen([str(ROLLBOX), *self.args, "--port", str(self.port)], stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def wait_serving(self) -> None:
        assert self.process is not None
        try:
            wait_until_serving(self.url, self.process, f"{self.args[0]} on {self.url}")
        except AssertionError as error:
            raise AssertionError(f"{error}; its output:\n{self.output()}") from None

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as when the machine's OOM killer or an operator strikes."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM, as an operator stops it; SIGKILL after half a minute (and the test fails)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.args[0]} on {self.url} ignored SIGTERM: {self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


@dataclass
class NodeAgent(Process):
    name: str = ""
    data_dir: Path = Path()


@dataclass
class Cluster:
    """Node agents named alpha, beta, ... and the routers in front of all of them."""

    root: Path
    secret_file: Path
    nodes: dict[str, NodeAgent]
    routers: list[Process] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    admins: tuple[str, ...] = ()
    data_plane: str = "auto"
    """The routers' `--data-plane`: nginx where it is installed (as the test set-up installs it), unless a test
    asks for the router's own."""

    @property
    def url(self) -> str:
        """The first router's."""
        return self.routers[0].url

    def add_router(self) -> Process:
        nodes = [arg for node in self.nodes.values() for arg in ("--node", node.url)]
        tokens = [arg for tenant, token in self.tokens.items() for arg in ("--token", f"{tenant}={token}")]
        admins = [arg for tenant in self.admins for arg in ("--admin", tenant)]
        router = Process(["serve", *nodes, "--secret-file", str(self.secret_file), *tokens, *admins,
                          "--data-plane", self.data_plane],
                         self.root / f"router-{len(self.routers)}.log")
        self.routers.append(router)
        router.start()
        wait_until_nodes_up(router.url, list(self.nodes))
        return router

    def close(self) -> None:
        """Stops every process with SIGTERM, then deletes what the nodes left running with `rollbox down`; fails
        when a process ignored SIGTERM, `rollbox down` failed, or any engine left something on the machine."""
        failures = []
        for process in [*self.routers, *self.nodes.values()]:
            try:
                process.stop()
            except AssertionError as error:
                failures.append(str(error))
        for node in self.nodes.values():
            if not (node.data_dir / "state.db").exists():
                continue
            down = subprocess.run([str(ROLLBOX), "down", "--data-dir", str(node.data_dir)], capture_output=True,
                                  text=True, timeout=120)
            if down.returncode != 0:
                failures.append(f"rollbox down --data-dir {node.data_dir}: {down.stderr}")
            left = leftovers(node.data_dir)
            if left:
                failures.append(f"node {node.name} left {left}")
                teardown_engine(Engine(node.data_dir))
        assert not failures, failures


def node_agent(root: Path, name: str, secret_file: Path, max_sandboxes: int = 16,
               extra: Sequence[str] = ()) -> NodeAgent:
    return NodeAgent(["node", "--name", name, "--data-dir", str(root / name), "--secret-file", str(secret_file),
                      "--max-sandboxes", str(max_sandboxes), *extra], root / f"{name}.log", name=name,
                     data_dir=root / name)


@contextlib.contextmanager
def running_cluster(root: Path, nodes: Mapping[str, int] = MappingProxyType({"alpha": 16, "beta": 16}), *,
                    tokens: dict[str, str] | None = None, admins: tuple[str, ...] = (),
                    data_plane: str = "auto", node_args: Sequence[str] = ()) -> Iterator[Cluster]:
    """A node agent per name in `nodes` (holding that many sandboxes at most, started with `node_args` besides) and
    one router in front of them, each node `up` at the router."""
    root.mkdir(parents=True, exist_ok=True)
    secret_file = root / "secret"
    secret_file.write_text(secrets.token_hex(32))
    secret_file.chmod(0o600)
    agents = {name: node_agent(root, name, secret_file, most, node_args) for name, most in nodes.items()}
    cluster = Cluster(root, secret_file, agents, tokens=dict(tokens or {}), admins=admins, data_plane=data_plane)
    try:
        for node in agents.values():
            node.spawn()
        for node in agents.values():
            node.wait_serving()
        cluster.add_router()
        yield cluster
    finally:
        cluster.close()


def router_health(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/healthz", timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def wait_until_nodes_up(url: str, names: list[str], timeout: float = 60.0) -> dict[str, Any]:
    """The router's health once it counts every node in `names` as up (templates copied, serving claims)."""
    def all_up() -> dict[str, Any] | None:
        health = router_health(url)
        nodes = health.get("nodes") or {}
        return health if all(nodes.get(name, {}).get("status") == "up" for name in names) else None

    return wait_for(all_up, f"nodes {names} up at the router {url}", timeout)


def node_of(sandbox_id: str) -> str:
    """The node a sandbox id names (`<node>-<hex>`)."""
    return sandbox_id.rpartition("-")[0]


def claim_on_every_node(client: SandboxClient, warmpool: str, names: Iterable[str], **claim: Any
                        ) -> dict[str, Sandbox]:
    """One sandbox per node in `names`, claimed from `warmpool` (with `claim`'s options) through the router (which
    picks the node)."""
    names = set(names)
    held: dict[str, Sandbox] = {}
    extra = []
    try:
        for _ in range(4 * len(names)):
            sandbox = client.create_sandbox(warmpool=warmpool, **claim)
            if node_of(sandbox.id) in held:
                extra.append(sandbox)
            else:
                held[node_of(sandbox.id)] = sandbox
            if set(held) == names:
                return held
        extra.extend(held.values())
        raise AssertionError(f"claims never reached every node: {sorted(held)} of {sorted(names)}")
    finally:
        for sandbox in extra:
            sandbox.delete()


def secret_of(cluster: Cluster) -> str:
    return cluster.secret_file.read_text().strip()


def environment_without_secret() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "ROLLBOX_CLUSTER_SECRET"}
