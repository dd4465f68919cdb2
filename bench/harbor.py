"""Harbor benchmark: `harbor run` (the real package and its own runner) over 20 Harbor-format tasks at concurrency 8
on a real `rollbox serve`, first with the oracle (every task must be solved), then with Harbor's do-nothing agent
(none may be), and rollbox's share of each trial's wall time beside the task's own.

The tasks are tests/support/harbor.py's: 20 tasks over 5 environments (a Dockerfile FROM a base of busybox, bash
and this machine's python3.11, pushed to Debian's docker-registry on loopback, that copies the task's data and runs
python once), each with tests/ and solution/. Nothing comes from outside.

Per trial, from the files a job leaves: its wall time (Harbor's result.json), rollbox's share (the environment's
`rollbox.json`: the start, which is the template's build or lookup, the claim and Harbor's directories; each
command call beyond the command's own run time; uploads and downloads; teardown), and the task's own time (its
commands' run time as the sandbox measured it) as the baseline it is set against. The oracle's job runs first, on
a fresh node, so its trials build the 5 templates; the do-nothing job finds them.

Run: `.venv/bin/python bench/harbor.py [--tasks 20] [--concurrency 8]` (needs .venv-harbor: scripts/setup.sh).
Prints a table per job and, as its last line, one JSON object of the figures (seconds), with `missed`: the targets
not met.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from common import Figures, distribution, load, machine, progress_bars

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support: the registry, the base, the tasks
from tests.support.harbor import (
    harbor_run,
    missing,
    push_base,
    reward,
    rollbox_serve,
    run_flags,
    trial_results,
    write_tasks,
)
from tests.support.registry import ImageMaker, running_registry

from rollbox._signals import exit_on_sigterm
from rollbox.rl.adapters.harbor import account

PARTS = ("build_s", "claim_s", "start_s", "overhead_s", "transfers_s", "stop_s")


def trial_figures(trial: Path, result: dict[str, Any]) -> dict[str, Any]:
    """One trial: its wall time, rollbox's parts of it and the task's own commands' time."""
    entry = account.read(trial) or {}
    started, finished = (datetime.fromisoformat(result[key]) for key in ("started_at", "finished_at"))
    return {"task": result["task_name"], "reward": reward(result), "error": result["exception_info"] is not None,
            "built": entry.get("built", False), "wall_s": (finished - started).total_seconds(),
            "build_s": entry.get("build_s", 0.0), "claim_s": entry.get("claim_s", 0.0),
            "start_s": entry.get("start_s", 0.0),
            "overhead_s": entry.get("exec_s", 0.0) - entry.get("command_s", 0.0),
            "transfers_s": entry.get("upload_s", 0.0) + entry.get("download_s", 0.0),
            "stop_s": entry.get("stop_s", 0.0), "rollbox_s": entry.get("rollbox_s", 0.0),
            "task_s": entry.get("command_s", 0.0), "calls": entry.get("exec_calls", 0)}


def run_job(url: str, tasks: Path, jobs: Path, agent: str, concurrency: int) -> Figures:
    started = time.monotonic()
    done = harbor_run(url, *run_flags(tasks, jobs, agent, agent, concurrency))
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"harbor run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    trials = sorted((trial_figures(trial, result) for trial, result in trial_results(jobs / agent).items()),
                    key=lambda trial: trial["task"])
    share = [trial["rollbox_s"] / trial["wall_s"] for trial in trials if trial["wall_s"] > 0]
    return {"job_s": round(elapsed, 2), "trials": trials, "solved": sum(trial["reward"] == 1.0 for trial in trials),
            "errors": sum(trial["error"] for trial in trials), "builds": sum(trial["built"] for trial in trials),
            **{key: distribution([trial[key] for trial in trials])
               for key in ("wall_s", "rollbox_s", "task_s", *PARTS)},
            "share": distribution(share)}


def report(name: str, job: Figures) -> None:
    table = Table(title=f"{name}: {job['solved']}/{len(job['trials'])} solved, {job['errors']} errors, "
                        f"{job['builds']} templates built, job {job['job_s']:.1f} s (seconds per trial)")
    for column in ("task", "reward", "built", "wall", "build or wait", "claim", "start (all)", "exec overhead",
                   "transfers", "teardown", "rollbox", "task's own", "rollbox share"):
        table.add_column(column, justify="left" if column == "task" else "right")
    for trial in job["trials"]:
        table.add_row(trial["task"], str(trial["reward"]), "yes" if trial["built"] else "",
                      *(f"{trial[key]:.3f}" for key in ("wall_s", *PARTS, "rollbox_s", "task_s")),
                      f"{trial['rollbox_s'] / trial['wall_s']:.0%}" if trial["wall_s"] else "")
    for stat in ("p50", "p99"):
        table.add_row(stat, "", "", *(f"{job[key][stat]:.3f}" for key in ("wall_s", *PARTS, "rollbox_s", "task_s")),
                      f"{job['share'][stat]:.0%}", style="bold")
    Console(width=170).print(table)


def missed(figures: Figures, count: int) -> list[str]:
    misses = []
    if figures["oracle"]["solved"] != count or figures["oracle"]["errors"]:
        misses.append(f"oracle {figures['oracle']['solved']}/{count} (errors {figures['oracle']['errors']})")
    if figures["nop"]["solved"] != 0 or figures["nop"]["errors"]:
        misses.append(f"nop {figures['nop']['solved']}/{count} (errors {figures['nop']['errors']})")
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--environments", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    if missing():
        raise SystemExit(f"bench/harbor.py {missing()}")
    exit_on_sigterm()
    figures: Figures = {"machine": machine(), "tasks": args.tasks, "environments": args.environments,
                        "concurrency": args.concurrency}
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-harbor-") as root, progress_bars() as progress:
        work = Path(root)
        step = progress.add_task("harbor", total=3)
        with running_registry(work / "registry") as registry:
            base = push_base(registry, ImageMaker(work / "images"))
            write_tasks(work / "tasks", base, args.tasks, args.environments)
            with rollbox_serve(work / "serve" / "data", registry.host) as url:
                progress.advance(step)
                for agent in ("oracle", "nop"):
                    figures[agent] = run_job(url, work / "tasks", work / "jobs", agent, args.concurrency)
                    progress.advance(step)
    figures["load_after"] = load()
    for agent in ("oracle", "nop"):
        report(agent, figures[agent])
    summary = {agent: {key: value for key, value in figures[agent].items() if key != "trials"}
               for agent in ("oracle", "nop")}
    targets = {"oracle": f"{args.tasks}/{args.tasks}", "nop": f"0/{args.tasks}"}
    print(json.dumps({**figures, **summary, "targets": targets, "missed": missed(figures, args.tasks)}))


if __name__ == "__main__":
    main()
