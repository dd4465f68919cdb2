"""The Ray + sandbox pattern on a rollbox cluster: `SandboxExecutor` actors (sandbox_executor.py), several at once,
each claim a sandbox from a warm pool through the router, run a task in it (a Fibonacci number, a JSON aggregation),
then try to get out: to the other sandboxes, the node agents, the Ray head, and back to the driver's host with a
reverse shell. Every probe must be refused or time out.

    python examples/ray/demo.py --address RAY_ADDRESS --url ROUTER_URL --token TOKEN

The probes aim at what the cluster itself advertises: the node agents' URLs on the router's /healthz, the Ray head's
GCS address, the Ray nodes' addresses, each other sandbox's server (sandbox i listens on 127.0.0.1:7000+i; a sandbox
has no address, so every host address and the loopback are tried), and a listener this script opens on the
driver's host for the reverse shells, which must receive nothing. Exits 0 when every task gave the driver's own
answer and every sandbox was contained; `--report FILE` writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # each executor prints its own claim, read by Ray when imported

import httpx
import ray
from sandbox_executor import TASKS, SandboxExecutor

LISTEN_BASE = 7000
LOOPBACK_SCAN = range(1, 1025)
PROBE = (Path(__file__).with_name("probe.py")).read_text()


class ConnectBackListener:
    """A TCP listener on the driver's host that counts who connects: the reverse shells' target."""

    def __init__(self, host: str) -> None:
        self.socket = socket.create_server((host, 0))
        self.host, self.port = host, self.socket.getsockname()[1]
        self.peers: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, peer = self.socket.accept()
            except OSError:  # closed
                return
            self.peers.append(f"{peer[0]}:{peer[1]}")
            connection.close()

    def close(self) -> None:
        self.socket.close()


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "//" in url else f"//{url}")
    assert parts.hostname and parts.port, url
    return parts.hostname, parts.port


def reachable(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=2).close()
    except OSError:
        return False
    return True


def cluster_targets(url: str) -> dict[str, Any]:
    """What the probes aim at, as the cluster advertises it."""
    nodes = httpx.get(f"{url}/healthz", timeout=10).json()["nodes"]
    agents = [host_port(node["url"]) for node in nodes.values() if node.get("url")]
    gcs = host_port(ray.get_runtime_context().gcs_address)
    hosts = {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
    return {"node_agents": agents, "gcs": gcs, "hosts": sorted(hosts | {host for host, _ in agents} | {gcs[0]})}


def probe_plan(index: int, count: int, targets: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
    siblings = [LISTEN_BASE + other for other in range(count) if other != index]
    return {"other sandboxes' servers": [(host, port) for host in sorted({"127.0.0.1", *targets["hosts"]})
                                         for port in siblings],
            f"loopback ports {LOOPBACK_SCAN[0]}-{LOOPBACK_SCAN[-1]}": [("127.0.0.1", p) for p in LOOPBACK_SCAN],
            "node agents": targets["node_agents"],
            "Ray head (GCS)": [targets["gcs"]],
            "control: its own server": [("127.0.0.1", LISTEN_BASE + index)]}


def expected_answers() -> dict[str, str]:
    """Each task's program run here on the driver, outside any sandbox: what the sandboxes must answer."""
    return {name: subprocess.run([sys.executable, "-c", program], input=stdin, capture_output=True, text=True,
                                 check=True).stdout.strip() for name, (program, stdin) in TASKS.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    targets = cluster_targets(args.url)
    driver_host = ray.util.get_node_ip_address()
    listener = ConnectBackListener(driver_host)
    live = {"node agents": all(map(reachable, targets["node_agents"])), "Ray head (GCS)": reachable(targets["gcs"])}
    names = list(TASKS)
    executors = [SandboxExecutor.remote(args.url, args.token, args.warmpool) for _ in range(args.executors)]
    try:
        ray_nodes = ray.get([executor.ready.remote() for executor in executors])  # all up, so they claim at once
        claims = ray.get([executor.claim.remote() for executor in executors])
        ray.get([executor.listen.remote(LISTEN_BASE + index) for index, executor in enumerate(executors)])
        tasks = ray.get([executor.run_task.remote(names[index % len(names)])
                         for index, executor in enumerate(executors)])
        probes = ray.get([executor.probe.remote(PROBE, probe_plan(index, len(executors), targets))
                          for index, executor in enumerate(executors)])
        shells = ray.get([executor.reverse_shells.remote(listener.host, listener.port) for executor in executors])
    finally:
        ray.get([executor.release.remote() for executor in executors])
        for executor in executors:
            ray.kill(executor)
        listener.close()
    expected = expected_answers()
    executed = [{"ray_node": ray_node, **claim, **task, "expected": expected[task["task"]], "probes": probe,
                 "reverse_shells": shell}
                for ray_node, claim, task, probe, shell in zip(ray_nodes, claims, tasks, probes, shells, strict=True)]
    return {"router": args.url, "ray_address": ray.get_runtime_context().gcs_address,
            "targets": {**targets, "connect_back": [listener.host, listener.port], "live_from_driver": live},
            "executors": executed, "connect_back_peers": listener.peers}


# -- what it prints ---------------------------------------------------------------------------------------------

def contained(outcome: dict[str, Any]) -> bool:
    return not outcome["connected"] and outcome["tried"] > 0


def describe(outcome: dict[str, Any]) -> str:
    parts = [f"{count} refused ({errno})" for errno, count in sorted(outcome["refused"].items())]
    parts += [f"{outcome['timed_out']} timed out"] if outcome["timed_out"] else []
    parts += [f"{len(outcome['connected'])} connected ({', '.join(outcome['connected'][:3])})"] \
        if outcome["connected"] else []
    return f"{outcome['tried']} tried: " + ", ".join(parts)


def verdicts(report: dict[str, Any]) -> dict[str, bool]:
    """Every task answered as on the driver, every probe blocked, every control connected, nothing reached back."""
    executors = report["executors"]
    shells = [shell for e in executors for shell in e["reverse_shells"].values()]
    return {"tasks": all(e["exit_code"] == 0 and e["output"] == e["expected"] for e in executors),
            "probes": all(contained(outcome) for e in executors for group, outcome in e["probes"].items()
                          if not group.startswith("control")),
            "controls": all(outcome["connected"] for e in executors for group, outcome in e["probes"].items()
                            if group.startswith("control")),
            "reverse_shells": not report["connect_back_peers"]
                              and all(shell["outcome"] in ("refused", "timed_out") for shell in shells),
            "targets_live": all(report["targets"]["live_from_driver"].values())}


def show(report: dict[str, Any]) -> None:
    targets, executors = report["targets"], report["executors"]
    agents = ", ".join(f"{host}:{port}" for host, port in targets["node_agents"])
    live = "yes" if all(targets["live_from_driver"].values()) else "NO"
    print(f"router {report['router']}, Ray head {report['ray_address']}, {len(executors)} SandboxExecutor actors")
    print(f"probe targets: node agents {agents}; Ray GCS {targets['gcs'][0]}:{targets['gcs'][1]}; hosts "
          f"{', '.join(targets['hosts'])}; reverse-shell listener {targets['connect_back'][0]}:"
          f"{targets['connect_back'][1]} (node agents and GCS reachable from the driver: {live})")
    for index, e in enumerate(executors):
        answer = "the driver's answer" if e["output"] == e["expected"] else f"the driver's answer is {e['expected']}"
        print(f"\nexecutor {index} (Ray node {e['ray_node'][:8]}): claimed {e['sandbox']} in {e['claim_ms']:.1f} ms")
        print(f"  task {e['task']}: {e['output']} ({answer})")
        for group, outcome in e["probes"].items():
            if group.startswith("control"):
                verdict = "probe works" if outcome["connected"] else "PROBE BROKEN"
            else:
                verdict = "contained" if contained(outcome) else "NOT CONTAINED"
            print(f"  {verdict:<14}{group:<31}{describe(outcome)}")
        for name, shell in e["reverse_shells"].items():
            verdict = "contained" if shell["outcome"] in ("refused", "timed_out") else "NOT CONTAINED"
            print(f"  {verdict:<14}{name:<31}{shell['outcome']}: {shell['said']}")
    latencies = [e["claim_ms"] for e in executors]
    peers = report["connect_back_peers"]
    print(f"\nclaim latency through the router: p50 {statistics.median(latencies):.1f} ms, max {max(latencies):.1f} ms "
          f"({len(latencies)} claims at once)")
    print(f"reverse-shell listener on the driver's host: {len(peers)} connections {' '.join(peers)}".rstrip())
    results = verdicts(report)
    print("ALL CONTAINED, every task gave the driver's answer" if all(results.values()) else
          f"FAILED: {', '.join(name for name, ok in results.items() if not ok)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"), help="the Ray cluster")
    parser.add_argument("--url", default=os.environ.get("ROLLBOX_URL", "http://127.0.0.1:8080"),
                        help="the rollbox router")
    parser.add_argument("--token", default=os.environ.get("ROLLBOX_TOKEN"), help="a tenant's token on the router")
    parser.add_argument("--warmpool", default="rl-python")
    parser.add_argument("--executors", type=int, default=4)
    parser.add_argument("--report", type=Path, help="also write every figure to this file as JSON")
    args = parser.parse_args(argv)
    ray.init(address=args.address, logging_level="WARNING")
    try:
        report = run(args)
    finally:
        ray.shutdown()
    show(report)
    if args.report:
        args.report.write_text(json.dumps(report, indent=1))
    return 0 if all(verdicts(report).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
