"""A real Ray cluster on loopback for the cluster tier and bench/cluster.py: a head and worker raylets (separate
processes, each a Ray node), every worker a rollbox node with its own data directory, and the router as a
`rollbox serve --ray` child process."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.engines import leftovers
from tests.support.servers import wait_until_serving

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every node on 127.0.0.1: test traffic stays on loopback
# Ray's token authentication, as a cluster on a shared network should run it: every process these clusters start
# (heads, raylets, routers, drivers) inherits the mode and the token. Set, not left to Ray: a token file in ~/.ray
# turns it on for `ray start` alone, and a router that was not told would be refused.
os.environ["RAY_AUTH_MODE"] = "token"
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

from ray.cluster_utils import Cluster

ROLLBOX = str(Path(sys.executable).with_name("rollbox"))
HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 2,
                 "health_check_initial_delay_ms": 0}
"""Ray declares a node that stopped answering dead after about a second (its defaults: 3 s x 5)."""


class RayTestCluster:
    def __init__(self, root: Path, workers: int = 3, max_sandboxes: int = 16) -> None:
        self.root = root
        self.max_sandboxes = max_sandboxes
        self.secret_file = root / "cluster-secret"
        self.secret_file.write_text(secrets.token_hex(32))
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": HEALTH_CHECKS})
        self.nodes: dict[str, Any] = {}
        self.data_dirs: dict[str, Path] = {}
        self.router: subprocess.Popen[bytes] | None = None
        self.url = ""
        for index in range(workers):
            self.add_node(f"w{index}")
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_node(self, name: str) -> None:
        data_dir = self.data_dirs.setdefault(name, self.root / name)
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1, resources={"rollbox": 1},
            labels={"rollbox.io/node": name, "rollbox.io/data-dir": str(data_dir),
                    "rollbox.io/max-sandboxes": str(self.max_sandboxes)})

    def remove_node(self, name: str, graceful: bool = False) -> None:
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=graceful)

    def start_router(self, port: int = 0, *extra: str) -> str:
        port = port or _free_port()
        log = (self.root / "router.log").open("ab")
        self.router = subprocess.Popen(
            [ROLLBOX, "serve", "--ray", self.address, "--port", str(port),
             "--secret-file", str(self.secret_file), "--max-sandboxes", str(self.max_sandboxes), *extra],
            stdout=log, stderr=log)
        self.url = f"http://127.0.0.1:{port}"
        wait_until_serving(self.url, self.router, "the router")
        return self.url

    def kill_router(self) -> None:
        assert self.router is not None
        self.router.send_signal(signal.SIGKILL)
        self.router.wait()

    def stop_router(self) -> None:
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()
            self.router.wait(timeout=30)

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/healthz").json()

    def wait_for(self, check: Any, timeout: float = 60.0, what: str = "the cluster") -> Any:
        """Polls the router's health until `check(health)` is true; returns that health."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.TransportError):
                health = self.health()
                if check(health):
                    return health
            assert time.monotonic() < deadline, f"{what} did not settle: {self.health()}"
            time.sleep(0.1)

    def wait_serving(self, count: int) -> dict[str, Any]:
        return self.wait_for(lambda h: sum(n["status"] == "up" for n in h["nodes"].values()) == count,
                             what=f"{count} serving nodes")

    def agent_pid(self, name: str) -> int:
        """The pid of the process (the Ray actor's) serving node `name`'s agent."""
        port = self.health()["nodes"][name]["url"].rsplit(":", 1)[1]
        listing = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
        return int(listing.split("pid=")[1].split(",")[0])

    def close(self) -> list[str]:
        """Stops everything and deletes what the node agents left; returns what is still on the machine."""
        self.stop_router()
        self.cluster.shutdown()  # the raylets and their workers, the node agents with them: sandboxes stay
        left = []
        for data_dir in self.data_dirs.values():
            if (data_dir / "state.db").exists():
                down(data_dir)
                left += leftovers(data_dir)
        return left


def down(data_dir: Path, timeout: float = 60.0) -> None:
    """`rollbox down` on a node's data directory, once its agent has exited: an agent runs in a Ray worker
    (titled `ray::NodeAgentActor`, so not found by its command line), which exits some moments after its raylet."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run([ROLLBOX, "down", "--data-dir", str(data_dir)], capture_output=True, text=True)
        if done.returncode == 0:
            return
        assert "runs on" in done.stderr and time.monotonic() < deadline, done.stderr
        time.sleep(0.2)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class AutoscalingTestCluster:
    """Ray's fake multi-node autoscaling cluster on this machine: a head whose autoscaler starts and stops worker
    raylets (each a Ray node offering `rollbox`) as if they were machines. Started in a Ray directory of its own,
    so stopping it stops only its own processes."""

    def __init__(self, root: Path, max_workers: int = 3, max_sandboxes: int = 4, min_workers: int = 1) -> None:
        self.root = root
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rbas-"))  # short: Ray's socket paths live under it
        self.secret_file = root / "cluster-secret"
        self.secret_file.write_text(secrets.token_hex(32))
        self.port = _free_port()
        config: dict[str, Any] = {
            "cluster_name": "rollbox-autoscaling", "max_workers": max_workers,
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": False, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": f"127.0.0.1:{self.port}"},
            "available_node_types": {
                "ray.head.default": {"resources": {}, "node_config": {}, "max_workers": 0},
                "rollbox.worker": {"resources": {"CPU": 1, "rollbox": 1}, "node_config": {},
                                   "labels": {"rollbox.io/max-sandboxes": str(max_sandboxes)},
                                   "min_workers": min_workers, "max_workers": max_workers}},
            "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0, "idle_timeout_minutes": 0.1,
            "docker": {}, "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": []}
        config_file = root / "autoscaling.json"
        config_file.write_text(json.dumps(config))
        environment = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        started = subprocess.run([str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={self.port}",
                        "--num-cpus=0", f"--temp-dir={self.temp_dir}", f"--autoscaling-config={config_file}",
                        "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                        f"--system-config={json.dumps(HEALTH_CHECKS, separators=(',', ':'))}"],
                       env=environment, capture_output=True, text=True)
        if started.returncode:
            self.close()  # it may have started some of its processes
            raise RuntimeError(f"ray start failed: {started.stdout[-2000:]} {started.stderr[-2000:]}")
        self.address = f"127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stops every process of this cluster (found by its Ray directory), the autoscaler's nodes with them."""
        for _ in range(50):
            mine = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _runs_in(int(pid), self.temp_dir)]
            if not mine:
                break
            for pid in mine:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _runs_in(pid: int, directory: Path) -> bool:
    try:
        return str(directory).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
