"""bench/cluster.py's table and verdicts: what each figure measures, the targets of issue 20 it is held to, and by
how much a missed one misses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.table import Table

from cluster_simulated import PACE
from common import Figures
from report import cell

Check = tuple[str, Callable[[Any], bool], Callable[[Any], str]]
"""The target as said, whether a figure meets it, and what the figure was."""


def _ms(value: Any) -> str:
    return f"{value} ms"


SIMULATED_TARGETS: dict[str, Check] = {
    "simulated_claims": (">= 3,000 claims/s through one router", lambda m: m["per_s"] >= 3000,
                         lambda m: f"{m['per_s']:.0f}/s (the router busy {m['router_cpu_busy']:.0%} of the time; its "
                                   f"CPU per claim allows {m['router_bound_per_s']}/s on a CPU of its own)"),
    "simulated_cpu_per_claim_ratio": ("router CPU per claim at 20,000 live within 20% of at 100",
                                      lambda r: 0.8 <= r <= 1.2, lambda r: f"x{r} (medians of the parts)"),
    "simulated_rss_per_live_claim_bytes": ("router memory <= 2 KB per live claim", lambda b: b <= 2048,
                                           lambda b: f"{b:.0f} bytes"),
    "simulated_handoffs": ("every claim served by the other router", lambda m: m["served"] == m["requested"],
                           lambda m: f"{m['served']}/{m['requested']}, 64 clients, through the other: exec true "
                                     f"p50 {(m['exec_ms'] or {}).get('p50')} ms, delete p50 "
                                     f"{(m['delete_ms'] or {}).get('p50')} ms" + (f"; failed: {m['failed']}"
                                                                                  if m["failed"] else "")),
}


def cluster_targets(side: str, client: str) -> dict[str, Check]:
    """The real-cluster targets for one way of serving (`router`, `ray`) through one client."""
    return {
        f"{side}_added_claim_c64_{client}_ms": ("p50 within 1 ms of the single server's", lambda d: d <= 1, _ms),
        f"{side}_claim_c64_{client}": ("p99 <= 25 ms", lambda m: m["n"] and m["p99"] <= 25,
                                       lambda m: f"p99 {m['p99']} ms"),
        f"{side}_added_exec_true_{client}_ms": ("<= 0.3 ms added at p50", lambda d: d <= 0.3, _ms),
    }


BESIDE = ("spliced", "pyrouter")
"""Sides measured beside the router for comparison, held to no target: the byte-copying floor, and the router
forwarding commands itself instead of through nginx."""


def targets(figures: Figures) -> dict[str, Check]:
    checks = {**SIMULATED_TARGETS, "ray_failed": ("the Ray cluster serves", lambda error: False, str)}
    for name in figures:
        side, _, rest = name.partition("_claim_c64_")
        if rest in ("raw", "sdk") and side not in ("single", *BESIDE):
            checks.update(cluster_targets(side, rest))
    return {name: check for name, check in checks.items() if name in figures}


def missed(figures: Figures) -> list[str]:
    return [name for name, (_, meets, _) in targets(figures).items() if not meets(figures[name])]


def verdicts(figures: Figures) -> list[str]:
    """One line per target: met or missed, and the figure."""
    lines = []
    for name, (said, meets, shown) in targets(figures).items():
        value = figures[name]
        simulated = "SIMULATED nodes: " if name.startswith("simulated") else ""
        lines.append(f"{'ok    ' if meets(value) else 'MISSED'} {simulated}{name}: {shown(value)} (target: {said})")
    for client in ("raw", "sdk"):
        claim, true = (figures.get(f"spliced_added_{phase}_{client}_ms") for phase in ("claim_c64", "exec_true"))
        if claim is not None:
            lines.append(f"floor  a byte-copying proxy in front of the single server ({client}) adds {claim} ms to a "
                         f"claim's p50 at 64 clients and {true} ms to `true`'s: no hop costs less")
        python_hop, routed, by_python = (figures.get(f"{side}_added_exec_true_{client}_ms")
                                         for side in ("forwarded", "router", "pyrouter"))
        if python_hop is not None and routed is not None:
            lines.append(f"floor  a hop in Python that only forwards bytes (uvicorn and the router's connection pool) "
                         f"in front of one node agent adds {python_hop} ms to `true`'s p50 ({client}); the router "
                         f"adds {routed} ms with nginx at its edge ({figures.get('router_data_plane')}), and "
                         f"{by_python} ms forwarding commands itself")
    return lines


SIDES = {"single": "single-machine rollbox serve",
         "spliced": "the single server behind a byte-copying proxy (the floor of a hop)",
         "forwarded": "a node agent behind a hop in Python that only forwards (bench/http_forwarder.py)",
         "router": "router over 3 node agents (static), nginx at its edge",
         "pyrouter": "the same router forwarding commands itself (--data-plane python)",
         "ray": "router over 3 node agents on Ray"}


def describe(name: str) -> str:
    if name.startswith("simulated_"):
        what = {"simulated_claims": "fill to 20,000 live claims, 64 clients",
                "simulated_at_few": f"claims, then deletes, at 100 live claims, {PACE:.0f}/s",
                "simulated_at_live": f"claims, then deletes, at 20,000 live claims, {PACE:.0f}/s"}
        return f"SIMULATED nodes (50, in memory) behind a real router: {what.get(name, name[10:])}"
    side, _, rest = name.partition("_")
    what, _, client = rest.rpartition("_")
    phases = {"claim_c1": "warm claim, 1 client", "claim_c64": "warm claim, 64 clients",
              "claim_c64_shared": "warm claim, 64 clients, CPUs shared", "exec_true": "exec true, 1 client, in turns"}
    return f"{SIDES.get(side, side)}: {phases.get(what, what)} ({client})"


def table(figures: Figures) -> Table:
    m = figures["machine"]
    ray = "with" if figures["ray"] else "without"
    report = Table(title=f"rollbox cluster benchmark ({figures['mode']}, {ray} Ray, {figures['elapsed_s']} s)",
                   caption=f"{machine_line(m)}. Latencies in ms; CPU: ms per "
                           "operation of the process the client talks to (nginx at a router's edge, a router, the "
                           "single server), of what is behind it (a router's own process behind nginx, the node "
                           "agents), and of the client; load: 1-minute load average as the phase "
                           "started")
    report.add_column("measurement")
    for column in ("p50", "p99", "n", "/s", "front CPU", "behind CPU", "client CPU", "load"):
        report.add_column(column, justify="right")
    report.add_column("notes")
    for name, value in figures.items():
        if not isinstance(value, dict) or name in ("machine", "simulated_handoffs") or name.startswith("faults_"):
            continue  # the faults phase says its figures in lines of its own (cluster_faults.verdicts)
        if name.startswith("simulated_at_"):
            for part in ("claim", "delete"):
                row(report, f"{describe(name)}: {part}s", value[part],
                    f"router RSS {value['router_rss_mb']} MB, CPU ms per claim by part {value['claim_cpu_ms_parts']}"
                    if part == "claim" else "")
        else:
            busy = value.get("router_cpu_busy")
            row(report, describe(name), value, "" if busy is None else f"router busy {busy:.0%} of the time, "
                                                                       f"{value['router_bound_per_s']}/s bound")
    return report


def machine_line(m: Figures) -> str:
    return (f"{m['cores']} cores, {m['memory_mb']} MB, Linux {m['kernel']}, runc {m['runc']}; load {m['load_before']} "
            f"before, {m['load_after']} after")


def row(report: Table, what: str, value: Figures, note: str) -> None:
    notes = [note] if note else []
    if value.get("cpus_apart"):
        notes.append("client, front loop: a CPU each")
    if value.get("cold"):
        notes.append(f"{value['cold']} cold (not in p50/p99)")
    report.add_row(what, cell(value["p50"]), cell(value["p99"]), str(value["n"]), cell(value.get("per_s"), 1),
                   cell(value.get("server_cpu_ms"), 3), cell(value.get("nodes_cpu_ms"), 3),
                   cell(value.get("client_cpu_ms"), 3), cell(value.get("load"), 1), ", ".join(notes))
