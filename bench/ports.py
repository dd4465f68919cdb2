"""Ports into a sandbox (docs/ports.md): an HTTP GET to a server inside a sandbox, through the router, beside a
command's round trip in the same sandbox, in the same run.

Run as root: `.venv/bin/python bench/ports.py [--quick]`. It starts `rollbox serve` on a free loopback port with a
throw-away data directory, applies a runc and a gVisor template, and in one sandbox of each starts Python's
`http.server` (a connection per request: each GET opens the port anew) and a keep-alive server. Then it times, in
turns, with one keep-alive client each:

- `GET /` through the router's path (`sandbox.url(8000)`) to `http.server`, and to the keep-alive server;
- `commands.run("true")` through rollbox's SDK, the baseline.

It prints a table (p50 and p99 in milliseconds) and, as its last line, one JSON object of every figure with
`missed`, the targets not met: under runc, a GET's p50 within 0.5 ms of the command's.
"""

from __future__ import annotations

import time

import httpx
from rich.table import Table

from common import Figures, distribution, load, machine
from compat import in_turns, main, server
from rollbox.client import SandboxClient

TEMPLATES = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: ports-runc}
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: ports-gvisor}
spec: {runtime: runsc}
"""
KEEP_ALIVE_SERVER = """\
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"ok"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
"""
WITHIN_MS = 0.5


def measure(_: int, runs: int) -> Figures:
    figures: Figures = {"machine": machine()}
    with server() as (url, token), SandboxClient(url, token=token) as client:
        client.apply(TEMPLATES)
        for runtime in ("runc", "gvisor"):
            samples = _runtime(client, token, runtime, runs if runtime == "runc" else max(20, runs // 5))
            figures.update({name: distribution(values) for name, values in samples.items()})
    figures["machine"]["load_after"] = load()
    figures["missed"] = [name for name in ("get_http_server_runc", "get_keep_alive_runc")
                         if figures[name]["p50"] > figures["command_runc"]["p50"] + WITHIN_MS]
    return figures


def _runtime(client: SandboxClient, token: str, runtime: str, count: int) -> dict[str, list[float]]:
    """The three calls, in turns, against one sandbox of `runtime`."""
    sandbox = client.create_sandbox(template=f"ports-{runtime}")
    try:
        sandbox.files.write("/tmp/keepalive.py", KEEP_ALIVE_SERVER)
        sandbox.commands.run("python3 -m http.server 8000", background=True)
        sandbox.commands.run("python3 /tmp/keepalive.py 8001", background=True)
        one_each, kept_alive = sandbox.url(8000), sandbox.url(8001)
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            _wait(http, one_each)
            _wait(http, kept_alive)
            samples: dict[str, list[float]] = {}
            in_turns({f"get_http_server_{runtime}": lambda: _ok(http.get(one_each)),
                      f"get_keep_alive_{runtime}": lambda: _ok(http.get(kept_alive)),
                      f"command_{runtime}": lambda: sandbox.commands.run("true")}, count, samples)
            return samples
    finally:
        sandbox.delete()


def _wait(http: httpx.Client, url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if http.get(url).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} does not answer")
        time.sleep(0.1)


def _ok(answer: httpx.Response) -> None:
    if answer.status_code != 200:
        raise RuntimeError(f"{answer.status_code}: {answer.text[:200]}")


def report(figures: Figures) -> Table:
    m = figures["machine"]
    table = Table(title=f"Ports into a sandbox ({m['cores']} cores, {m['memory_mb']} MB, kernel {m['kernel']}, "
                        f"load {m['load_before']} -> {m['load_after']})")
    for column in ("what", "runtime", "p50 ms", "p99 ms", "n", "target"):
        table.add_column(column)
    for runtime in ("runc", "gvisor"):
        baseline = figures[f"command_{runtime}"]["p50"]
        for what, name in (("GET / (http.server, a connection each)", "get_http_server"),
                           ("GET / (a keep-alive server)", "get_keep_alive"),
                           ("commands.run('true')", "command")):
            value = figures[f"{name}_{runtime}"]
            target = "baseline" if name == "command" else (
                f"p50 <= {baseline + WITHIN_MS:.2f} (command + {WITHIN_MS})" if runtime == "runc" else "")
            table.add_row(what, runtime, f"{value['p50']:.2f}", f"{value['p99']:.2f}", str(value["n"]), target)
    return table


if __name__ == "__main__":
    main(__doc__, measure, report)
