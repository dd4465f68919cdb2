"""RL benchmark: scripted episodes per second, SandboxFusion `/run_code` per second, the main job's wall time.

Run as root: `.venv/bin/python bench/rl.py [--quick] [--url URL]`. Without --url it starts the
embedded server on a throw-away data directory (and removes everything it made). It prints a table
and, as its last line, one JSON object of every figure for scripts to read. Targets: >= 20
five-step episodes/s, >= 60 isolated /run_code print(1)/s, main job < 300 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from common import load, machine
from cpu import TICKS, cpu_seconds, server_pid
from rollbox._signals import exit_on_sigterm
from rollbox.client import AsyncSandboxClient
from rollbox.rl.collect import Observation, collect_async
from rollbox.rl.fusion import fusion_app
from rollbox.rl.tasks import load_tasks
from rollbox.server.capability import SecretPath, new_key
from rollbox.server.local import LocalServer
from rollbox.server.threaded import ThreadServer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TARGETS = {"episodes_per_s": 20.0, "run_code_per_s": 60.0, "train_wall_s": 300.0}
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


def table(figures: dict[str, Any]) -> Table:
    view = Table(title="rollbox RL benchmark" + (" (quick)" if figures["mode"] == "quick" else ""))
    for column in ("figure", "value", "target"):
        view.add_column(column, justify="left" if column == "figure" else "right")
    for name, value in figures.items():
        if name not in ("mode", "machine"):
            target = TARGETS.get(name)
            view.add_row(name, str(value), "" if target is None else (f"< {target:g}" if name.endswith("_s") and
                                                                      "per" not in name else f">= {target:g}"))
    return view


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, the main job with 2 iterations")
    parser.add_argument("--url", help="benchmark this router instead of an embedded one (the main job still embeds)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--skip-train", action="store_true", help="leave out the main job")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rollbox-bench-rl-", dir="/var/tmp"))
    figures: dict[str, Any] = {"mode": "quick" if args.quick else "full", "machine": machine()}
    try:
        with router(args.url, work) as url:
            figures.update(asyncio.run(episodes(url, args.quick, args.concurrency)))
            for isolation in ("isolated", "fresh"):
                figures.update(asyncio.run(run_code(url, args.quick, args.concurrency, isolation)))
        if not args.skip_train:
            figures.update(main_job(args.quick, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["machine"]["load_after"] = load()
    Console().print(table(figures))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
