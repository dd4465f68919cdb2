"""Deterministic sandboxes (docs/determinism.md): how many of the 20 commands agents commonly run give the same bytes
in two episodes of the same actions (the host's clock, load and uptime made to differ between them), under runc and
gVisor, in deterministic mode and in the default mode; and what the mode costs: exec `true` and an RL episode
(claim, start state, five steps, delete), deterministic and default runs alternated in one run.

    PYTHONPATH=src python bench/determinism.py [--runtimes runc,runsc] [--execs 200] [--episodes 20]

Targets: 20 of 20 identical under each runtime; exec `true` and an episode within 1.1x of the default mode.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import distribution, load, machine, progress_bars, throwaway_engine, timed
from tests.support.determinism import PROBES, TEMPLATE

from rollbox.engine import Container, Engine
from rollbox.spec import SandboxTemplate

OVERHEAD = 1.1
EPISODE_STEPS = ["ls -la --full-time", "python3 -c 'import uuid, time; print(uuid.uuid4(), time.time())'",
                 "echo change >> src/calc.py && python3 -c 'import src.calc'", "git --version || true", "cat README.md"]
"""An RL episode's steps after its start state is written: listings, Python, an edit."""


def build(engine: Engine, runtime: str, deterministic: bool) -> str:
    name = f"{'det' if deterministic else 'plain'}-{runtime}"
    spec = {**TEMPLATE["spec"], "runtime": runtime, "deterministic": deterministic}
    engine.build(SandboxTemplate.model_validate({"metadata": {"name": name}, "spec": spec}))
    return name


def observe(box: Container) -> dict[str, str]:
    return {name: (lambda r: f"[{r.exit_code}]{r.stdout}|{r.stderr}")(box.exec(command, timeout=60))
            for name, command in PROBES}


def two_episodes(engine: Engine, template: str) -> dict[str, bool]:
    """The same commands in two fresh sandboxes: the second after a pause and with a core of the host busy."""
    with engine.create(template) as box:
        first = observe(box)
    time.sleep(1.3)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with engine.create(template) as box:
            second = observe(box)
    finally:
        burner.kill()
        burner.wait()
    return {name: first[name] == second[name] for name in first}


def alternate(count: int, modes: dict[str, Callable[[], object]], progress, label: str) -> dict[str, list[float]]:
    """Runs the modes in turn, `count` times each, so that the machine's load weighs on each alike."""
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    task = progress.add_task(label, total=count)
    for _ in range(count):
        for mode, action in modes.items():
            samples[mode].append(timed(action))
        progress.advance(task)
    return samples


def episode(engine: Engine, template: str) -> None:
    with engine.create(template) as box:
        box.files.write("/work/task/README.md", "# task\n")
        box.files.write("/work/task/src/calc.py", "def add(a, b):\n    return a + b\n")
        for step in EPISODE_STEPS:
            box.exec(step, cwd="/work/task", timeout=60)


def costs(engine: Engine, runtime: str, templates: dict[bool, str], execs: int, episodes: int, progress) -> dict:
    with engine.create(templates[True]) as det, engine.create(templates[False]) as plain:
        det.exec("true"), plain.exec("true")
        exec_ms = alternate(execs, {"deterministic": lambda: det.exec(["true"]),
                                    "default": lambda: plain.exec(["true"])}, progress, f"exec true ({runtime})")
    episode_ms = alternate(episodes, {"deterministic": lambda: episode(engine, templates[True]),
                                      "default": lambda: episode(engine, templates[False])}, progress,
                           f"RL episode ({runtime})")
    figures = {}
    for name, samples in (("exec_true_ms", exec_ms), ("episode_ms", episode_ms)):
        figures[name] = {mode: distribution(values) for mode, values in samples.items()}
        figures[name]["ratio"] = round(figures[name]["deterministic"]["p50"] / figures[name]["default"]["p50"], 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtimes", default="runc,runsc")
    parser.add_argument("--execs", type=int, default=200, help="exec `true` per mode under runc (a fifth under runsc)")
    parser.add_argument("--episodes", type=int, default=20,
                        help="RL episodes per mode under runc (a fifth under runsc)")
    args = parser.parse_args()
    runtimes = args.runtimes.split(",")
    figures: dict = {"bench": "determinism", "machine": machine(), "identical": {}, "default_identical": {},
                     "probes": {}, "overhead": {}}
    missed = []
    with throwaway_engine() as engine, progress_bars() as progress:
        for runtime in runtimes:
            templates = {mode: build(engine, runtime, mode) for mode in (True, False)}
            task = progress.add_task(f"two episodes of {len(PROBES)} commands ({runtime})", total=2)
            same = two_episodes(engine, templates[True])
            progress.advance(task)
            default = two_episodes(engine, templates[False])
            progress.advance(task)
            figures["probes"][runtime] = {"deterministic": same, "default": default}
            figures["identical"][runtime] = sum(same.values())
            figures["default_identical"][runtime] = sum(default.values())
            missed += [f"{runtime}: {name} differs" for name, equal in same.items() if not equal]
            slower = runtime == "runsc"  # a command there takes tens of ms, an episode seconds
            overhead = costs(engine, runtime, templates, max(10, args.execs // (5 if slower else 1)),
                             max(3, args.episodes // (5 if slower else 1)), progress)
            figures["overhead"][runtime] = overhead
            for name in ("exec_true_ms", "episode_ms"):
                if overhead[name]["ratio"] > OVERHEAD:
                    missed.append(f"{runtime}: {name} {overhead[name]['ratio']}x the default mode (target "
                                  f"{OVERHEAD}x)")
    figures["machine"]["load_after"] = load()
    print(f"{'command':<26}" + "".join(f"{runtime + ' det':>12}{runtime + ' default':>16}" for runtime in runtimes))
    for name, _ in PROBES:
        cells = "".join(f"{'same' if figures['probes'][r]['deterministic'][name] else 'DIFFERS':>12}"
                        f"{'same' if figures['probes'][r]['default'][name] else 'differs':>16}" for r in runtimes)
        print(f"{name:<26}{cells}")
    print(f"{'identical':<26}" + "".join(f"{figures['identical'][r]:>9}/{len(PROBES)}"
                                         f"{figures['default_identical'][r]:>13}/{len(PROBES)}" for r in runtimes))
    print()
    for runtime in runtimes:
        for name in ("exec_true_ms", "episode_ms"):
            row = figures["overhead"][runtime][name]
            print(f"{runtime} {name:<14} deterministic p50 {row['deterministic']['p50']:>9} p99 "
                  f"{row['deterministic']['p99']:>9} | default p50 {row['default']['p50']:>9} p99 "
                  f"{row['default']['p99']:>9} | ratio {row['ratio']}x (n={row['default']['n']})")
    print(f"machine: {figures['machine']}")
    print(json.dumps({**figures, "missed": missed}))


if __name__ == "__main__":
    main()
