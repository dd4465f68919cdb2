"""bench/server.py's table: what each figure measures and through which client, and the targets it is held to."""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table

from clients import RawClient, SdkClient
from common import Figures
from plan import CONCURRENCY, Plan, turnover_clients

TARGETS: dict[str, tuple[str, Callable[[Figures], bool]]] = {
    "claim_c64": ("p50 <= 5, p99 <= 25 ms", lambda m: m["p50"] <= 5 and m["p99"] <= 25),
    "exec_true": ("p50 <= 4 ms", lambda m: m["p50"] <= 4),
    "exec_load": (">= 400/s", lambda m: m["per_s"] >= 400),
    "python_isolated": (">= 60/s", lambda m: m["per_s"] >= 60),
    "burst": ("all served, p99 <= 1 s", lambda m: m["n"] == m["requested"] and m["p99"] <= 1000),
    "tracing_claim": ("tracing on: p50 <= 1.05 x off", lambda m: m["ratio"] <= 1.05),
    "tracing_exec": ("tracing on: p50 <= 1.05 x off", lambda m: m["ratio"] <= 1.05),
}
"""Issue 3 item 9's targets by phase, each client's figure held to them: reported, not asserted."""


def missed(figures: Figures) -> list[str]:
    """Figures under their target; one with nothing measured (every call failed) is under it."""
    return [name for name, value in figures.items() if name.rpartition("_")[0] in TARGETS
            and not (value["n"] and TARGETS[name.rpartition("_")[0]][1](value))]


def describe(name: str, plan: Plan) -> tuple[str, str]:
    """What a figure measures, and through which client."""
    workers = plan.workers
    engine = {"engine_exec_true_ms": "exec true (sync, as bench/engine.py)",
              "engine_exec_async_true_ms": "exec true (exec_async, as the server), in turns",
              "engine_create_ms": "create a sandbox", "engine_delete_ms": "delete a sandbox",
              "engine_python_ms": f"python3 print(1), {workers} threads, a sandbox each",
              "engine_python_per_s": f"python3 print(1), {workers} threads, a sandbox each"}
    if name in engine:
        return engine[name], "engine"
    tracing_floor = {"tracing_span_cpu_us": "OpenTelemetry SDK: CPU per span recorded, ended, encoded (in-process)",
                     "tracing_claim_floor_ratio": "warm claim: least p50 ratio its 2 spans allow (their CPU alone)",
                     "tracing_exec_floor_ratio": "exec true: least p50 ratio its 2 spans allow (their CPU alone)"}
    if name in tracing_floor:
        return tracing_floor[name], "opentelemetry-sdk"
    what, _, client = name.rpartition("_")
    phases = {"exec_true": "exec true, 1 client, in turns with engine",
              "exec_load": f"exec true, {workers} clients, a sandbox each",
              "python_reuse": f"python3 print(1), {workers} clients, a sandbox each",
              "python_isolated": f"python3 print(1) as isolated commands, {workers} clients, a sandbox each",
              "python_fresh": f"python3 print(1), a fresh sandbox each (claim, exec, delete), {workers} clients",
              "burst": f"burst of {plan.burst} claims, pool of {plan.burst}",
              **{f"claim_c{c}": f"warm claim, {c} clients back to back" for c in CONCURRENCY},
              f"claim_c{CONCURRENCY[-1]}_shared": f"warm claim, {CONCURRENCY[-1]} clients back to back, client and "
                                                  "server sharing the CPUs as the scheduler places them",
              "claim_turnover": f"warm claim right after a delete, {turnover_clients(plan)} clients "
                                "at once (an RL step's turnover: deletions and refill under way)",
              f"http_floor_c{CONCURRENCY[-1]}": f"HTTP floor: a constant answer from a bare ASGI app on uvicorn, "
                                                f"{CONCURRENCY[-1]} clients back to back, loopback TCP",
              f"http_floor_unix_c{CONCURRENCY[-1]}": "HTTP floor as above, on a unix socket",
              "tracing_claim_off": "warm claim, 1 client, tracing off", "tracing_claim": "warm claim, tracing on",
              "tracing_claim_before": "warm claim, code before tracing", "tracing_exec_off": "exec true, tracing off",
              "tracing_exec": "exec true, tracing on (OTLP)", "tracing_exec_before": "exec true, code before tracing",
              "tracing_claim_sampled": "warm claim, tracing on, 10% of traces sampled",
              "tracing_exec_sampled": "exec true, tracing on, 10% of traces sampled"}
    if what in phases:
        return phases[what], {"raw": RawClient.label, "sdk": SdkClient.label}[client]
    return name.replace("_", " "), ""


def notes(value: Figures) -> str:
    said = ["client, server loop: a CPU each"] if value.get("cpus_apart") else []
    if value.get("cold"):
        said.append(f"{value['cold']} cold" + (f" (p50 {value['cold_p50']:.1f} ms, not in p50/p99)"
                                               if value.get("cold_p50") else ""))
    if "claim_p50" in value:
        said.append(f"p50: claim {value['claim_p50']:.1f}, exec {value['exec_p50']:.1f}, "
                    f"delete {value['delete_p50']:.1f} ms")
    if "requested" in value:
        said.append(f"{value['n']}/{value['requested']} served in {value['wall_s']} s")
    if value.get("failed"):
        said.append(f"failed: {value['failed']}")
    return ", ".join(said)


def cell(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def table(figures: Figures, plan: Plan) -> Table:
    m = figures["machine"]
    report = Table(title=f"rollbox server benchmark ({figures['mode']}, {figures['elapsed_s']} s, "
                         f"server: {m['server']})",
                   caption=f"{m['cores']} cores, {m['memory_mb']} MB, Linux {m['kernel']}, runc {m['runc']}; "
                           f"load {m['load_before']} before, {m['load_after']} after. Latencies in ms; "
                           "CPU: ms per operation of the server process and of this one (the client); "
                           "load: 1-minute load average as the phase started")
    for column in ("measurement", "client"):
        report.add_column(column)
    for column in ("p50", "p99", "n", "/s", "server CPU", "client CPU", "load"):
        report.add_column(column, justify="right")
    report.add_column("target")
    report.add_column("notes")
    for name, value in figures.items():
        if name in ("machine", "mode", "elapsed_s", "plan", "missed"):
            continue
        what, client = describe(name, plan)
        phase = name.rpartition("_")[0]
        target = ""
        if phase in TARGETS:
            text = TARGETS[phase][0]
            target = f"[red]{text} MISSED[/]" if name in figures["missed"] else f"[green]{text} ok[/]"
        if isinstance(value, dict):
            report.add_row(what, client, cell(value["p50"]), cell(value["p99"]), str(value["n"]),
                           cell(value.get("per_s"), 1), cell(value.get("server_cpu_ms")),
                           cell(value.get("client_cpu_ms")), cell(value.get("load"), 1), target, notes(value))
        else:
            unit = next((unit for suffix, unit in (("per_s", None), ("_ratio", "x"), ("_us", " µs")) if
                         name.endswith(suffix)), " ms")
            report.add_row(what, client, "", "", "", f"{value}" if unit is None else "", "", "", "", target,
                           "" if unit is None else f"{value}{unit}")
    return report
