"""Processes benchmark: background processes streaming at once, and a terminal's keystroke round trip, through a real
server and the SDK (docs/processes.md).

Run as root: `.venv/bin/python bench/processes.py [--quick] [--runtime runc|runsc]`. It starts the embedded server
(`LocalServer`: `rollbox serve` in a child process, on a unix socket of its own) on a throw-away data directory,
applies a template and a warm pool of two sandboxes, claims both, and measures, each phase in a sandbox of its own:

- **streams**: 100 background processes started at once (`commands.run(..., background=True)` through the asyncio
  SDK), each printing numbered lines with a short sleep between them (bash's `read -t`: no process per line), all
  followed at once with `events(0)`. Every line of every process must arrive, in order, with no `gap`, and every
  process must end with exit code 0; then each is streamed again from the middle of its output (as after a
  reconnect) and read back whole with `wait()`, and both must match what was streamed. It reports the total time,
  lines per second, and each line's latency from the moment bash printed it (`$EPOCHREALTIME`) to the moment the
  SDK handed it over (lines printed once their stream was open: earlier ones waited for the stream, not in it).
- **pty**: a terminal (`pty=True`) running `stty raw -echo; exec cat`, so every byte typed is written back by a
  program in the sandbox: one keystroke sent with `send_stdin` (the blocking SDK), timed until its echo comes out
  of the process's event stream. In turns with it, the same round trip through a terminal of this machine (Python's
  `pty` module, `cat` on the slave in raw mode, `os.write` and `os.read` on the master: the physical floor) and
  `commands.run("true")` through the same client (what one call through the router costs).

The template raises the sandbox's pids limit to 1024: each background process is two processes (its supervisor in
the exec agent and the command), and each call on one forks a short-lived handler, so 100 of them need more than the
default 256. A stream that fails (its sandbox died, say) is counted with its error, the sandbox's state after, and
its missing lines as lost. Under gVisor (`--runtime runsc`) the sentry's ptrace stubs count as host tasks against the
sandbox's host pids limit (1024 x 16 + 256) and grow as the processes run: 100 lines per process fit, 500 do not
(docs/processes.md, "Measured"). It prints the machine, a table and, as its last line, one JSON object of every
figure (milliseconds unless named otherwise) with `missed`: the targets not met (no line lost; a keystroke's round
trip p50 <= 5 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pty
import subprocess
import tempfile
import time
import tty
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from common import Figures, distribution, load, machine, progress_bars
from cpu import cpu_seconds
from rollbox._signals import exit_on_sigterm
from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.client._process_handles import AsyncProcessHandle, ProcessHandle
from rollbox.errors import RollboxError
from rollbox.server.local import LocalServer

POOL = "processes-bench"
PROCESSES = 100
PAUSE = 0.01
"""Seconds each process sleeps between two lines."""
KEYS = "abcdefghijklmnopqrstuvwxyz0123456789"
TARGETS = {"lost_lines": 0, "pty_round_trip_p50_ms": 5.0}
"""No line of any process lost; a keystroke echoed back through a terminal in 5 ms (p50)."""


def documents(runtime: str) -> str:
    return f"""\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {{name: {POOL}}}
spec:
  runtime: {runtime}
  limits: {{pids: 1024}}
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {{name: {POOL}}}
spec:
  sandboxTemplateRef: {{name: {POOL}}}
  replicas: 2
"""


def warm(client: SandboxClient) -> None:
    deadline = time.monotonic() + 120
    while client.get_warmpool(POOL).ready < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("the warm pool did not fill in two minutes")
        time.sleep(0.05)


# -- 100 processes streaming at once ----------------------------------------------------------------------------

def script(number: int, lines: int) -> list[str]:
    """Prints `number:i:time` for i in 1..lines, sleeping PAUSE between lines without starting a process."""
    loop = f'for ((i=1; i<={lines}; i++)); do echo "{number}:$i:$EPOCHREALTIME"; read -t {PAUSE} || :; done'
    return ["bash", "--noprofile", "--norc", "-c", loop]


@dataclass
class Followed:
    """What one process's stream delivered."""

    number: int
    text: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    gaps: int = 0
    chunks: int = 0
    first_offset: int | None = None
    opened: float = 0.0
    """When the stream's first event came (lines printed before it waited for the stream, not in it)."""
    exit_code: int | None = None
    ended: bool = False
    error: str | None = None
    """Why the stream failed, if it did (its sandbox died, say)."""

    @property
    def output(self) -> str:
        return "".join(self.text)


async def follow(handle: AsyncProcessHandle, number: int, progress: Progress, task: int) -> Followed:
    """Streams the process from its first byte to its end, timing each line as it is handed over."""
    seen = Followed(number)
    try:
        await _follow(handle, seen, progress, task)
    except RollboxError as error:
        seen.error = f"{type(error).__name__}: {error}"
    return seen


async def _follow(handle: AsyncProcessHandle, seen: Followed, progress: Progress, task: int) -> None:
    partial = ""
    async with contextlib.aclosing(handle.events(0)) as events:
        async for event in events:
            if event.type == "start":
                seen.first_offset = event.offset
                seen.opened = time.time()
            elif event.type == "gap":
                seen.gaps += 1
            elif event.type == "stdout":
                now = time.time()
                seen.chunks += 1
                seen.text.append(event.data)
                *complete, partial = (partial + event.data).split("\n")
                for line in complete:
                    with_time = line.rsplit(":", 1)
                    if len(with_time) == 2 and float(with_time[1]) >= seen.opened:
                        seen.latencies.append((now - float(with_time[1])) * 1000)
                progress.advance(task, len(complete))
            elif event.type == "end":
                seen.ended = True
                seen.exit_code = event.result.exit_code if event.result else None
                break


def check(seen: Followed, lines: int) -> dict[str, int]:
    """Lines lost and lines out of order in what a process's stream delivered."""
    got = [line.rsplit(":", 1)[0] for line in seen.output.splitlines()]
    expected = [f"{seen.number}:{i}" for i in range(1, lines + 1)]
    missing = len(set(expected) - set(got))
    return {"lost": missing, "out_of_order": int(not missing and got != expected), "received": len(got)}


async def streams(url: str, server_pid: int, sandbox_id: str, lines: int, progress: Progress) -> Figures:
    async with AsyncSandboxClient(url) as client:
        box = await client.get_sandbox(sandbox_id)
        task = progress.add_task(f"{PROCESSES} processes x {lines} lines", total=PROCESSES * lines)
        started = time.perf_counter()
        cpu = cpu_seconds(server_pid), time.process_time()
        handles = await asyncio.gather(*(box.commands.run(script(n, lines), background=True, tag=f"bench-{n}")
                                         for n in range(PROCESSES)))
        start_s = time.perf_counter() - started
        followed = await asyncio.gather(*(follow(handle, n, progress, task) for n, handle in enumerate(handles)))
        total_s = time.perf_counter() - started
        server_cpu, client_cpu = cpu_seconds(server_pid) - cpu[0], time.process_time() - cpu[1]
        counts = [check(seen, lines) for seen in followed]
        errors = sorted({seen.error for seen in followed if seen.error})
        listed, replays_wrong = {}, 0
        try:
            listed = {info.id: info for info in await box.commands.list()}
            for handle, seen in zip(handles, followed, strict=True):
                whole = seen.output.encode()
                middle = len(whole) // 2
                again = "".join([event.data async for event in handle.events(middle) if event.type == "stdout"])
                result = await handle.wait()
                replays_wrong += int(again.encode() != whole[middle:] or result.stdout != seen.output)
            for handle in handles:
                await handle.delete()
        except RollboxError as error:  # the sandbox died with its streams: they said why
            errors.append(f"after the streams: {type(error).__name__}: {error}")
        state = (await client.get_sandbox(sandbox_id)).info.state
    received = sum(count["received"] for count in counts)
    return {
        "processes": PROCESSES, "lines_per_process": lines, "lines_expected": PROCESSES * lines,
        "lines_received": received, "lost_lines": sum(count["lost"] for count in counts),
        "out_of_order": sum(count["out_of_order"] for count in counts),
        "gaps": sum(seen.gaps for seen in followed),
        "not_ended_or_failed": sum(not seen.ended or seen.exit_code != 0 for seen in followed),
        "listed_ended_ok": sum(not info.running and info.exit_code == 0 for info in listed.values()
                               if info.tag and info.tag.startswith("bench-")),
        "replays_wrong": replays_wrong,
        "failed_streams": sum(seen.error is not None for seen in followed), "errors": errors[:5],
        "sandbox_state_after": state,
        "start_all_s": round(start_s, 3), "total_s": round(total_s, 3),
        "floor_s": round(lines * PAUSE, 3),
        "lines_per_s": round(received / total_s, 1),
        "line_latency_ms": distribution(latencies) if (latencies := [ms for seen in followed for ms in seen.latencies])
        else {"p50": None, "p99": None, "n": 0},
        "stdout_events": sum(seen.chunks for seen in followed),
        "server_cpu_s": round(server_cpu, 3), "client_cpu_s": round(client_cpu, 3),
    }


# -- a terminal's keystroke round trip ---------------------------------------------------------------------------

class HostTerminal:
    """`cat` on a terminal of this machine in raw mode: a byte written to the master comes back from cat."""

    def __init__(self) -> None:
        self.master, slave = pty.openpty()
        tty.setraw(slave)
        self.cat = subprocess.Popen(["cat"], stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)

    def round_trip(self, key: str) -> float:
        start = time.perf_counter()
        os.write(self.master, key.encode())
        echoed = b""
        while key.encode() not in echoed:
            echoed += os.read(self.master, 1024)
        return (time.perf_counter() - start) * 1000

    def close(self) -> None:
        self.cat.kill()
        self.cat.wait()
        os.close(self.master)


class SandboxTerminal:
    """The same in the sandbox: a process on a terminal, keystrokes by `send_stdin`, echoes from its event stream."""

    def __init__(self, client: SandboxClient, sandbox_id: str) -> None:
        box = client.get_sandbox(sandbox_id)
        self.handle: ProcessHandle = box.commands.run(["/bin/sh", "-c", "stty raw -echo; echo ready; exec cat"],
                                                      background=True, pty=True, tag="bench-pty")
        self.events = self.handle.events(0)
        self.pending = ""
        self.read_until("ready")

    def read_until(self, text: str) -> None:
        while text not in self.pending:
            event = next(self.events)
            if event.type == "end":
                raise RuntimeError(f"the terminal's process ended: {self.pending!r}")
            self.pending += event.data
        self.pending = self.pending.split(text, 1)[1]

    def round_trip(self, key: str) -> tuple[float, float]:
        """(the keystroke's echo, the send_stdin call alone), in milliseconds."""
        start = time.perf_counter()
        self.handle.send_stdin(key)
        sent = time.perf_counter()
        self.read_until(key)
        return (time.perf_counter() - start) * 1000, (sent - start) * 1000

    def close(self) -> None:
        self.events.close()  # type: ignore[attr-defined]
        self.handle.delete()


def terminals(url: str, sandbox_id: str, count: int, progress: Progress) -> Figures:
    samples: dict[str, list[float]] = {"pty_round_trip_ms": [], "pty_send_stdin_ms": [], "host_pty_round_trip_ms": [],
                                       "run_true_ms": []}
    with SandboxClient(url) as client:
        box = client.get_sandbox(sandbox_id)
        host, sandbox = HostTerminal(), SandboxTerminal(client, sandbox_id)
        try:
            for key in KEYS:  # untimed: connections and caches warm
                sandbox.round_trip(key)
                host.round_trip(key)
                box.commands.run("true")
            task = progress.add_task(f"{count} keystrokes, in turns with the baselines", total=count)
            for i in range(count):
                key = KEYS[i % len(KEYS)]
                echoed, sent = sandbox.round_trip(key)
                samples["pty_round_trip_ms"].append(echoed)
                samples["pty_send_stdin_ms"].append(sent)
                samples["host_pty_round_trip_ms"].append(host.round_trip(key))
                start = time.perf_counter()
                box.commands.run("true")
                samples["run_true_ms"].append((time.perf_counter() - start) * 1000)
                progress.advance(task)
        finally:
            host.close()
            sandbox.close()
    return {name: distribution(values) for name, values in samples.items()}


# -- the run -----------------------------------------------------------------------------------------------------

def measure(lines: int, keystrokes: int, runtime: str) -> Figures:
    figures: Figures = {"machine": machine(), "runtime": runtime}
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-processes-") as root, \
            LocalServer(Path(root) / "data") as server, progress_bars() as progress:
        with SandboxClient(server.url) as client:
            client.apply(documents(runtime))
            warm(client)
            sandboxes = [client.create_sandbox(warmpool=POOL) for _ in range(2)]  # a phase each
        try:
            assert server.pid is not None
            figures["streams"] = asyncio.run(streams(server.url, server.pid, sandboxes[0].id, lines, progress))
            figures.update(terminals(server.url, sandboxes[1].id, keystrokes, progress))
        finally:
            with SandboxClient(server.url) as client:
                for sandbox in sandboxes:
                    client.delete_sandbox(sandbox.id)
    figures["machine"]["server"] = "embedded, unix socket"
    figures["machine"]["load_after"] = load()
    pty_p50 = figures["pty_round_trip_ms"]["p50"]
    figures["pty_over_host_pty"] = round(pty_p50 / figures["host_pty_round_trip_ms"]["p50"], 1)
    figures["pty_over_run_true"] = round(pty_p50 / figures["run_true_ms"]["p50"], 2)
    figures["targets"] = TARGETS
    figures["missed"] = [name for name, met in (
        ("lost_lines", figures["streams"]["lost_lines"] == 0 and figures["streams"]["gaps"] == 0
         and figures["streams"]["out_of_order"] == 0 and figures["streams"]["not_ended_or_failed"] == 0
         and figures["streams"]["replays_wrong"] == 0 and not figures["streams"]["errors"]),
        ("pty_round_trip_p50_ms", pty_p50 <= TARGETS["pty_round_trip_p50_ms"])) if not met]
    return figures


def report(figures: Figures) -> Table:
    m, s = figures["machine"], figures["streams"]
    table = Table(title=f"processes under {figures['runtime']} ({m['cores']} cores, {m['memory_mb']} MB, kernel "
                        f"{m['kernel']}, runc {m['runc']}, load {m['load_before']} -> {m['load_after']})")
    for column in ("what", "p50 ms", "p99 ms", "n", "note"):
        table.add_column(column)
    lost = "none lost" if "lost_lines" not in figures["missed"] else (
        f"LOST {s['lost_lines']}, gaps {s['gaps']}, out of order {s['out_of_order']}, failed {s['not_ended_or_failed']}"
        f", replays wrong {s['replays_wrong']}, streams failed {s['failed_streams']} (sandbox "
        f"{s['sandbox_state_after']}: {s['errors'][0][:120] if s['errors'] else ''})")
    table.add_row(f"{s['processes']} processes x {s['lines_per_process']} lines: line printed -> SDK",
                  str(s["line_latency_ms"]["p50"]), str(s["line_latency_ms"]["p99"]),
                  str(s["lines_received"]),
                  f"{lost}; all in {s['total_s']:.2f} s (sleeps alone {s['floor_s']:g} s), "
                  f"{s['lines_per_s']:.0f} lines/s in {s['stdout_events']} events; CPU-s: server "
                  f"{s['server_cpu_s']:.2f}, this client {s['client_cpu_s']:.2f}")
    rows = [("pty_round_trip_ms", "keystroke -> echo, through rollbox", "target p50 <= 5 ms"),
            ("pty_send_stdin_ms", "  of which the send_stdin call", ""),
            ("host_pty_round_trip_ms", "keystroke -> echo, a host pty (floor)",
             f"rollbox {figures['pty_over_host_pty']}x"),
            ("run_true_ms", "commands.run('true') (baseline)", f"rollbox pty {figures['pty_over_run_true']}x")]
    for name, what, note in rows:
        value = figures[name]
        table.add_row(what, f"{value['p50']:.3f}", f"{value['p99']:.3f}", str(value["n"]), note)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 lines per process and 200 keystrokes "
                                                             "(not 500 and 1000)")
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc", help="the sandbox's runtime")
    args = parser.parse_args()
    exit_on_sigterm()
    start = time.perf_counter()
    figures = measure(100, 200, args.runtime) if args.quick else measure(500, 1000, args.runtime)
    figures["mode"] = "quick" if args.quick else "full"
    figures["elapsed_s"] = round(time.perf_counter() - start, 1)
    Console(width=170).print(report(figures))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
