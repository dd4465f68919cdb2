"""RL benchmark: scripted episodes per second, SandboxFusion `/run_code` per second, the main job's wall time.

Run as root: `.venv/bin/python bench/rl.py [--quick] [--url URL] [--ray]`. Without --url it starts the
embedded server on a throw-away data directory (and removes everything it made). With --ray it then plays
the same episodes in rounds, taking turns, on that server and through a router over a local Ray cluster of three
rollbox nodes (examples/ray/local_cluster.py: a head and three worker raylets, a node agent on each), and
compares their CPU per episode: the machine's (every process, the kernel's included) and each side's
own (its processes, its sandboxes and the client's). It prints a table and, as its last line, one JSON object of
every figure for scripts to read, with the targets missed in `missed`. Targets: >= 20 five-step episodes/s, >= 60
isolated /run_code print(1)/s, main job <= 300 s, and the cluster's CPU per episode at most 10% above the single
server's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from common import load, machine
from cpu import TICKS, cpu_seconds, server_pid
from rollbox._signals import exit_on_sigterm
from rollbox.client import AsyncSandboxClient
from rollbox.engine.cgroups import Cgroups
from rollbox.rl.collect import Observation, collect_async
from rollbox.rl.fusion import fusion_app
from rollbox.rl.tasks import load_tasks
from rollbox.rl.trajectory import Trajectory
from rollbox.server.capability import SecretPath, new_key
from rollbox.server.local import LocalServer
from rollbox.server.threaded import ThreadServer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TARGETS = {"episodes_per_s": 20.0, "run_code_per_s": 60.0, "train_wall_s": 300.0, "cluster_episode_cpu_ratio": 1.1}
AT_MOST = ("train_wall_s", "cluster_episode_cpu_ratio")
"""The targets that are ceilings; the others are floors."""
CLUSTER_NODE_SANDBOXES = 48
"""Each of the cluster's three nodes: about the single server's 128 between them."""
FUSION_POOL = """
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {name: fusion-bench}
spec: {replicas: 24, refillConcurrency: 4, sandboxTemplateRef: {name: rl-python}}
"""


async def five_steps(observation: Observation) -> Any:
    """A scripted episode: look around, read, fix, check, submit (the reference fix, so reward 1)."""
    fix = observation.task.solution[0]  # type: ignore[index]
    script = [{"tool": "bash", "command": "ls -R"}, {"tool": "read_file", "path": fix.path},
              {"tool": "str_replace", "path": fix.path, "old": fix.old, "new": fix.new},
              {"tool": "bash", "command": f"grep -c def {fix.path}"}, {"tool": "submit"}]
    return script[observation.step]


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (every process, kernel threads included)."""
    ticks = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS


def p50(values: list[float]) -> float:
    return round(statistics.median(values), 1) if values else 0.0


async def episodes(url: str, quick: bool, concurrency: int) -> dict[str, Any]:
    tasks = load_tasks(EXAMPLES / "tasks")
    async with AsyncSandboxClient(url) as client:
        await collect_async(five_steps, tasks[:2], client=client, group_size=4, tag="warmup", progress=False)
        server = server_pid()
        started, machine, own = time.perf_counter(), busy_seconds(), time.process_time()
        served = cpu_seconds(server) if server else 0.0
        played = await collect_async(five_steps, tasks[:5] if quick else tasks, client=client, group_size=8,
                                     groups=1 if quick else 2, concurrency=concurrency, progress=False)
        wall = time.perf_counter() - started
        spent = {"total": busy_seconds() - machine, "client": time.process_time() - own,
                 "server": cpu_seconds(server) - served if server else None}
    steps = [step for t in played for step in t.steps]
    per_episode = {part: None if seconds is None else round(seconds * 1000 / len(played), 1)
                   for part, seconds in spent.items()}
    if per_episode["server"] is not None:
        per_episode["runtime_sandboxes_kernel"] = round(per_episode["total"] - per_episode["client"]
                                                        - per_episode["server"], 1)
    return {"episodes": len(played), "episodes_per_s": round(len(played) / wall, 1),
            "episode_cpu_ms": per_episode,
            "episode_resolved": round(sum(t.resolved for t in played) / len(played), 3),
            "episode_errors": sum(t.error is not None for t in played),
            "step_p50_ms": p50([s.sandbox_ms for s in steps if not s.terminated]),
            "verify_p50_ms": p50([s.sandbox_ms for s in steps if s.terminated]),
            "claim_p50_ms": p50([t.claim_ms for t in played]), "fork_p50_ms": p50([t.fork_ms for t in played])}


async def run_code(url: str, quick: bool, concurrency: int, isolation: str) -> dict[str, Any]:
    async with AsyncSandboxClient(url) as client, AsyncSandboxClient(url) as gateway_client:
        await client.apply(FUSION_POOL)
        # the gateway's own client (it runs on the server thread's event loop), on a loopback port under its
        # key, as SandboxFusion's clients reach it
        key = new_key()
        app = fusion_app(gateway_client, warmpool="fusion-bench", isolation=isolation)  # type: ignore[arg-type]
        with ThreadServer(SecretPath(app, key), tcp=True) as gateway:
            async with httpx.AsyncClient(base_url=f"{gateway.url}/{key}", timeout=60) as http:
                gate = asyncio.Semaphore(concurrency)
                latencies: list[float] = []

                async def one() -> bool:
                    async with gate:
                        started = time.perf_counter()
                        answer = (await http.post("/run_code", json={"code": "print(1)", "language": "python"})).json()
                        latencies.append((time.perf_counter() - started) * 1000)
                        return answer["status"] == "Success" and answer["run_result"]["stdout"] == "1\n"

                await asyncio.gather(*(one() for _ in range(concurrency)))
                count = 60 if quick else 300
                latencies.clear()
                started = time.perf_counter()
                ok = await asyncio.gather(*(one() for _ in range(count)))
                wall = time.perf_counter() - started
        await client.delete_warmpool("fusion-bench")
    name = "run_code" if isolation == "isolated" else f"run_code_{isolation}"
    return {f"{name}_requests": count, f"{name}_per_s": round(count / wall, 1), f"{name}_ok": sum(ok),
            f"{name}_p50_ms": p50(latencies)}


def main_job(quick: bool, data_dir: Path) -> dict[str, Any]:
    """`python -m rollbox.rl.train` as a user runs it: embedded server start and template apply included."""
    out = data_dir.parent / "train-out"
    command = [sys.executable, "-m", "rollbox.rl.train", "--no-progress", "--out-dir", str(out),
               "--data-dir", str(data_dir / "train")] + (["--iterations", "2"] if quick else [])
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the main job failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"train_wall_s": round(wall, 1), "train_episodes": summary["episodes"],
            "train_success_first": round(summary["iterations"][0]["success_rate"], 3),
            "train_success_last": round(summary["iterations"][-1]["success_rate"], 3)}


@contextlib.contextmanager
def router(url: str | None, data_dir: Path) -> Iterator[str]:
    if url:
        yield url
        return
    with LocalServer(data_dir / "bench") as server:
        asyncio.run(_apply(server.url))
        yield server.url


async def _apply(url: str) -> None:
    async with AsyncSandboxClient(url) as client:
        await client.apply(str(EXAMPLES / "templates" / "rl-python.yaml"))


# -- --ray: the same episodes through a router over a local Ray cluster, in rounds taking turns with the single server

@dataclass
class Side:
    """One way of serving the episodes, and what its rounds cost."""

    url: str
    token: str | None
    roots: list[int]
    """Its processes, each with every process under it."""
    data_dirs: list[Path]
    """Its engines: the CPU of their sandboxes is its own."""
    played: list[Trajectory] = field(default_factory=list)
    wall: float = 0.0
    machine: float = 0.0
    own: float = 0.0

    def spent(self) -> float:
        """CPU seconds of its processes (with the children they reaped) and of its engines' sandboxes (their
        parent cgroup, which keeps what removed sandboxes used)."""
        stats = {}
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                stats[int(entry.name)] = (int(fields[1]), sum(int(ticks) for ticks in fields[11:15]))
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in stats.items():
            children.setdefault(parent, []).append(pid)
        pids, ticks = list(self.roots), 0
        while pids:
            pid = pids.pop()
            ticks += stats.get(pid, (0, 0))[1]
            pids += children.get(pid, [])
        sandboxes = 0.0
        for data_dir in self.data_dirs:
            with contextlib.closing(sqlite3.connect(data_dir / "state.db")) as db:
                (engine_id,) = db.execute("SELECT value FROM meta WHERE key='engine_id'").fetchone()
            sandboxes += Cgroups(engine_id).cpu_seconds("")
        return ticks / TICKS + sandboxes

    def figures(self) -> dict[str, Any]:
        count = len(self.played)
        return {"episodes": count, "episodes_per_s": round(count / self.wall, 1),
                "episode_cpu_ms": {"total": round(self.machine * 1000 / count, 1),
                                   "own": round(self.own * 1000 / count, 1)},
                "episode_errors": sum(t.error is not None for t in self.played),
                "claim_p50_ms": p50([t.claim_ms for t in self.played]),
                "step_p50_ms": p50([s.sandbox_ms for t in self.played for s in t.steps if not s.terminated])}


async def take_turns(sides: list[Side], rounds: int, quick: bool, concurrency: int) -> None:
    """Plays the episodes on each side in turn, `rounds` times, so that both meet the same moments of a shared
    machine. A round's machine-wide CPU is charged to its side less what the other side spent meanwhile, idle; its
    own is its processes', its sandboxes' and this client's."""
    tasks = load_tasks(EXAMPLES / "tasks")
    clients = [AsyncSandboxClient(side.url, side.token) for side in sides]
    try:
        for client in clients:
            await collect_async(five_steps, tasks[:2], client=client, group_size=4, tag="warmup", progress=False)
        for _ in range(rounds):
            for side, client in zip(sides, clients, strict=True):
                before = [other.spent() for other in sides]
                started, machine, mine = time.perf_counter(), busy_seconds(), time.process_time()
                side.played += await collect_async(five_steps, tasks[:5] if quick else tasks, client=client,
                                                   group_size=8, concurrency=concurrency, progress=False)
                side.wall += time.perf_counter() - started
                spent = [other.spent() - held for other, held in zip(sides, before, strict=True)]
                its = spent[sides.index(side)]
                side.own += its + time.process_time() - mine
                side.machine += busy_seconds() - machine - (sum(spent) - its)
    finally:
        for client in clients:
            await client.close()


def compare_on_ray(single_url: str, quick: bool, concurrency: int, work: Path) -> dict[str, Any]:
    """The single server (embedded, at `single_url`) against a router over a local Ray cluster of three rollbox
    nodes (examples/ray/local_cluster.py), both with the same template and warm pool; `cluster_nodes_used` counts
    the nodes that ran the episodes' commands."""
    sys.path.insert(0, str(EXAMPLES / "ray"))
    from local_cluster import local_ray_cluster

    server = server_pid()
    assert server is not None, "the single server is the embedded one"
    with local_ray_cluster(work / "ray", max_sandboxes=CLUSTER_NODE_SANDBOXES) as cluster:
        agents = [node["url"] for node in cluster.apply(EXAMPLES / "templates" / "rl-python.yaml")["nodes"].values()
                  if node.get("url")]
        before = [commands_run(url) for url in agents]
        ray_processes = [pid for pid in started_here() if pid != server]  # Ray's, and the router
        single = Side(single_url, None, [server], [work / "bench"])
        on_ray = Side(cluster.url, cluster.token, ray_processes, cluster.data_dirs)
        asyncio.run(take_turns([single, on_ray], 3 if quick else 4, quick, concurrency))
        used = sum(commands_run(url) > count for url, count in zip(agents, before, strict=True))
    cluster_cpu, single_cpu = on_ray.figures()["episode_cpu_ms"], single.figures()["episode_cpu_ms"]
    return {**{f"cluster_{name}": value for name, value in on_ray.figures().items()},
            **{f"cluster_single_{name}": value for name, value in single.figures().items()},
            "cluster_episode_cpu_ratio": round(cluster_cpu["total"] / single_cpu["total"], 3),
            "cluster_episode_own_cpu_ratio": round(cluster_cpu["own"] / single_cpu["own"], 3),
            "cluster_nodes_used": used}


def started_here() -> list[int]:
    """The processes this one started."""
    me = os.getpid()
    return [int(pid) for thread in os.listdir(f"/proc/{me}/task")
            for pid in Path(f"/proc/{me}/task/{thread}/children").read_text().split()]


def commands_run(agent: str) -> float:
    """A node agent's count of commands run (its /metrics); 0 from one that no longer answers."""
    with contextlib.suppress(httpx.HTTPError, TypeError):
        return float(re.search(r"^rollbox_execs_total (\S+)$", httpx.get(f"{agent}/metrics").text, re.M)[1])
    return 0.0


def missed(figures: dict[str, Any]) -> list[str]:
    return [name for name, target in TARGETS.items() if name in figures
            and not (figures[name] <= target if name in AT_MOST else figures[name] >= target)]


def table(figures: dict[str, Any]) -> Table:
    view = Table(title="rollbox RL benchmark" + (" (quick)" if figures["mode"] == "quick" else ""))
    for column in ("figure", "value", "target"):
        view.add_column(column, justify="left" if column == "figure" else "right")
    for name, value in figures.items():
        if name not in ("mode", "machine", "missed"):
            target = TARGETS.get(name)
            view.add_row(name, str(value), "" if target is None else
                         f"{'<=' if name in AT_MOST else '>='} {target:g}")
    return view


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, the main job with 2 iterations")
    parser.add_argument("--url", help="benchmark this router instead of an embedded one (the main job still embeds)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--skip-train", action="store_true", help="leave out the main job")
    parser.add_argument("--ray", action="store_true",
                        help="also play the episodes through a router over a local three-node Ray cluster")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rollbox-bench-rl-", dir="/var/tmp"))
    figures: dict[str, Any] = {"mode": "quick" if args.quick else "full", "machine": machine()}
    try:
        with router(args.url, work) as url:
            figures.update(asyncio.run(episodes(url, args.quick, args.concurrency)))
            for isolation in ("isolated", "fresh"):
                figures.update(asyncio.run(run_code(url, args.quick, args.concurrency, isolation)))
            if args.ray:
                figures.update(compare_on_ray(url, args.quick, args.concurrency, work))
        if not args.skip_train:
            figures.update(main_job(args.quick, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["machine"]["load_after"] = load()
    figures["missed"] = missed(figures)
    Console().print(table(figures))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
