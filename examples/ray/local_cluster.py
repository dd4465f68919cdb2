"""A Ray cluster on this machine, as `ray start` would make one on several: a head and worker raylets (each a
separate Ray node offering the resource `rollbox`, with its own data directory), and the router
(`rollbox serve --ray`) in front of them with one tenant, who may also apply templates and warm pools.

Every node runs on 127.0.0.1, so nothing of it is reachable from elsewhere. When it stops, it deletes every
sandbox the node agents left (`rollbox down` on each data directory); templates stay with their directories.
run_local.py runs the example on it, and `bench/rl.py --ray` its RL episodes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray then puts every node on 127.0.0.1

from ray.cluster_utils import Cluster

from rollbox import SandboxClient
from rollbox.server.listen import listen_tcp

ROLLBOX = str(Path(sys.executable).with_name("rollbox"))
TENANT = "trainer"
START_TIMEOUT = 120.0


@dataclass
class LocalRayCluster:
    root: Path
    workers: int = 3
    max_sandboxes: int = 16
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    url: str = ""
    data_dirs: list[Path] = field(default_factory=list)
    _ray: Any = None
    _router: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """The Ray head's GCS address, what `ray.init(address=...)` and `rollbox serve --ray` take."""
        return self._ray.address

    def start(self) -> None:
        """The head (no CPUs: nothing of the work runs there), the workers, and the router once every node agent
        serves."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._ray = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "dashboard_port": free_port()})  # Ray's 8265 may be taken
        for index in range(self.workers):
            name = f"node-{index}"
            data_dir = self.root / name
            self.data_dirs.append(data_dir)
            self._ray.add_node(num_cpus=1, resources={"rollbox": 1},
                               labels={"rollbox.io/node": name, "rollbox.io/data-dir": str(data_dir),
                                       "rollbox.io/max-sandboxes": str(self.max_sandboxes)})
        self._ray.wait_for_nodes()
        secret = self.root / "cluster-secret"
        secret.write_text(secrets.token_hex(32))
        tokens = self.root / "tokens"
        tokens.write_text(f"{TENANT}={self.token}\n")
        for private in (secret, tokens):
            private.chmod(0o600)
        port = free_port()
        with (self.root / "router.log").open("ab") as log:
            self._router = subprocess.Popen(
                [ROLLBOX, "serve", "--ray", self.address, "--port", str(port), "--secret-file", str(secret),
                 "--tokens-file", str(tokens), "--admin", TENANT, "--max-sandboxes", str(self.max_sandboxes)],
                stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self.wait_for(lambda health: sum(node["status"] == "up" for node in health["nodes"].values()) == self.workers,
                      "every node serving")

    def apply(self, manifest: Path) -> dict[str, Any]:
        """Applies the templates and warm pools of `manifest` through the router, then waits until every pool is
        full; returns the router's health then."""
        with SandboxClient(self.url, self.token) as client:
            client.apply(manifest)
        return self.wait_for(lambda health: bool(health["pools"]) and all(
            pool["ready"] >= pool["replicas"] for pool in health["pools"].values()), "full warm pools")

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/healthz", timeout=10).json()

    def wait_for(self, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """Polls the router's /healthz until `check` accepts it."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with contextlib.suppress(httpx.TransportError, ValueError, KeyError):
                health = self.health()
                if check(health):
                    return health
            assert self._router is not None
            if self._router.poll() is not None or time.monotonic() > deadline:
                log = (self.root / "router.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"waiting for {what}, the router gave up or stopped; its log:\n{log}")
            time.sleep(0.1)

    @property
    def router_pid(self) -> int | None:
        return self._router.pid if self._router else None

    def close(self) -> None:
        if self._router is not None and self._router.poll() is None:
            self._router.terminate()
            self._router.wait(timeout=60)
        if self._ray is not None:
            self._ray.shutdown()  # the raylets, and the node agents with them: their sandboxes stay
        for data_dir in self.data_dirs:
            if (data_dir / "state.db").exists():
                subprocess.run([ROLLBOX, "down", "--data-dir", str(data_dir)], check=True, capture_output=True)


def free_port() -> int:
    with listen_tcp("127.0.0.1", 0) as probe:
        return probe.getsockname()[1]


@contextlib.contextmanager
def local_ray_cluster(root: Path, workers: int = 3, max_sandboxes: int = 16) -> Iterator[LocalRayCluster]:
    cluster = LocalRayCluster(root, workers, max_sandboxes)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
