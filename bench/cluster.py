"""Cluster benchmark: the router's own cost at scale, on SIMULATED nodes, and the router in front of real node agents
against the single-machine server, in the same run (issue 20's targets).

Run as root: `.venv/bin/python bench/cluster.py [--quick] [--ray | --no-ray]`. It makes everything it measures in a
throw-away directory and removes it all at the end:
- 50 SIMULATED nodes (simulated_node.py: claims and warm pools in memory, no containers) behind one real router
  process (`rollbox serve --node URL` x 50): claims per second up to 20,000 live claims, the router's CPU per claim at
  100 and at 20,000 live claims, its resident memory per live claim, and claims made through that router served by
  a second one (cluster_simulated.py);
- three real node agents (`rollbox node`, a data directory and engine each) behind a router, the single-machine
  `rollbox serve`, and, with Ray, a router over three node agents on a local Ray cluster (a head and three worker
  raylets): warm claims at 1 and 64 clients and `true` one at a time, all ways taking turns (cluster_real.py);
- faults under 32 clients' claims (issue 33's targets): the router killed, a node agent killed and restarted, one
  frozen, one killed for good (cluster_faults.py; `--faults-only` runs this phase alone).

It prints a table (medians and p99 in ms, the machine, the load), a verdict per target, how the CPUs were shared,
and, as its last line, one JSON object of every figure with the targets missed in `missed`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console

import cluster_faults
import cluster_real
import cluster_simulated
from cluster_report import machine_line, missed, table, verdicts
from common import Figures, load, machine, progress_bars
from rollbox._signals import exit_on_sigterm

NOTES = (
    "SIMULATED figures come from 50 stand-in nodes (bench/simulated_node.py) that keep claims and warm pools in memory "
    "and start no containers, served by rollbox's own API in one process; the router in front of them is the real "
    "one. While timed, the router's event loop has a CPU of its own; the client and the simulated nodes share the "
    "other. A simulated node answers through the same server stack as a router, so it costs about as much CPU per "
    "claim: when the router is busy less than all the time, that other CPU set the rate, and the router's own bound "
    "is 1000 / its CPU ms per claim.",
    "Real cluster: the client, the routers, the node agents and the single server all share this machine's CPUs. In "
    "the rounds marked 'a CPU each' the client runs on one CPU and the process it talks to (the single server, nginx's "
    "worker at a router's edge, or a router forwarding itself) on another, as bench/server.py times claims; what is "
    "behind it (a router's own process, the node agents) runs where the scheduler puts it, since two cores cannot "
    "give client, router and nodes one each as machines of their own would. A claim through a router costs the "
    "front's CPU and a node agent's on the same cores, where a single server's costs one process's; with 64 clients "
    "back to back the p50 is about 64 claims' worth of the busiest CPU's work, so here it shows their sum, not the "
    "hop a router on its own machine adds. Compare 'front CPU' with the single server's CPU per claim for what the "
    "router's own machine would carry.",
)
RAY_NOTE = ("Ray: the head and the three worker raylets run throughout the real-cluster rounds, beside every side; the "
            "Ray router's process is also a Ray driver, and its node agents run in Ray actors' worker processes.")


def ray_available() -> bool:
    return importlib.util.find_spec("ray") is not None


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples: under 90 s")
    parser.add_argument("--ray", action=argparse.BooleanOptionalAction,
                        help="also measure a router over a local Ray cluster (default: when Ray is installed, but not "
                             "with --quick: a Ray cluster of four raylets takes 20 to 40 s to start here)")
    parser.add_argument("--faults-only", action="store_true", help="only the faults phase (about 3 minutes)")
    args = parser.parse_args()
    ray = args.ray if args.ray is not None else ray_available() and not args.quick and not args.faults_only
    start = time.perf_counter()
    figures: Figures = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-cluster-") as root, progress_bars() as progress:
        simulated, real, faults = Path(root) / "simulated", Path(root) / "real", Path(root) / "faults"
        simulated_s = 0.0
        if not args.faults_only:
            simulated.mkdir()
            real.mkdir()
            figures.update(cluster_simulated.measure(simulated, cluster_simulated.QUICK if args.quick
                                                     else cluster_simulated.FULL, progress))
            simulated_s = time.perf_counter() - start
            figures.update(cluster_real.measure(real, cluster_real.QUICK if args.quick else cluster_real.FULL,
                                                progress, ray))
        figures.update(cluster_faults.measure(faults, progress))
    figures["machine"]["load_after"] = load()
    figures["mode"] = "faults only" if args.faults_only else "quick" if args.quick else "full"
    figures["ray"] = ray
    figures["elapsed_s"] = round(time.perf_counter() - start, 1)
    figures["simulated_elapsed_s"] = round(simulated_s, 1)
    figures["missed"] = missed(figures) + cluster_faults.missed(figures)
    console = Console(width=200)
    notes = [] if args.faults_only else [*NOTES, *([RAY_NOTE] if ray else [])]
    if args.faults_only:
        console.print(f"{figures['mode']}: {machine_line(figures['machine'])}", highlight=False, markup=False)
    else:
        console.print(table(figures))
    for line in (*verdicts(figures), *cluster_faults.verdicts(figures), *notes):
        console.print(line, highlight=False, markup=False)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
