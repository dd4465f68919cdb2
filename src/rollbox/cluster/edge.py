"""The router's edge: nginx in front of the router's routes, passing an episode's calls (a warm claim, a command run,
a file read or written, the sandbox's description, stats and deletion) straight to the nodes, and every other call
to the router.

A hop that parses HTTP in Python costs more on a command than the router may add to it (docs/cluster.md, "What a hop
costs"); nginx forwards at the cost of copying bytes. It decides nothing the router would decide otherwise: a call
goes straight to a node only when nginx knows the caller's token exactly and the node the sandbox's id names;
anything else, a call whose node it could not reach included, goes to the router, which answers as it always does.
So the router's answers stay the API's, and the edge only makes the common case faster.

The router writes nginx's configuration (edge_config.py) from its tokens and its view of the nodes, and has nginx
load it again (SIGHUP) when a node's address changes or a node starts or stops taking claims. nginx serves on the
router's listening socket, which it inherits; the router itself listens on a loopback port of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import shutil
import signal
import socket as sockets
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from rollbox.cluster.edge_config import CALLS, Routes, render, targets
from rollbox.cluster.view import NodeState
from rollbox.server.metrics import Metrics

log = logging.getLogger("rollbox.cluster")

NGINX = "nginx"
REFUSED = {"404", "429", "503"}
"""A node's answers to a warm claim that made nothing."""
Withdraw = Callable[[str, str], None]
"""Withdraws a claim attempt (its id) on the node at a URL (cluster/withdrawals.py)."""
PIPE_SIZE = 1 << 20
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
_PR_SET_PDEATHSIG = 1


def available() -> str | None:
    """nginx's path, when it is installed."""
    return shutil.which(NGINX)


class Edge:
    """nginx serving `listener` in front of the router at `router` (`host:port`), in a private directory of its own,
    until `close`."""

    def __init__(self, listener: sockets.socket, router: str, secret: str, tokens: Mapping[str, str] | None,
                 max_body: int, executable: str) -> None:
        self._listener = listener
        self._executable = executable
        self._routes = Routes(_address(listener), router, secret, dict(tokens or {}), max_body)
        self.root = Path(tempfile.mkdtemp(prefix="rollbox-edge-"))  # 0700: the configuration holds the tokens
        self._config = self.root / "nginx.conf"
        self._process: subprocess.Popen[bytes] | None = None
        self._reader = self._keeper = -1

    def start(self, view: Mapping[str, NodeState]) -> None:
        self._open_calls()
        self._write(*targets(view))
        fd = self._listener.fileno()
        self._process = subprocess.Popen(
            [self._executable, "-c", str(self._config), "-e", str(self.root / "error.log")],
            env={**os.environ, "NGINX": f"{fd};"}, pass_fds=(fd,), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT
        while not (self.root / "nginx.pid").exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start: {self.errors()}")
            time.sleep(0.01)

    def update(self, view: Mapping[str, NodeState]) -> bool:
        """Loads the configuration again if the nodes' addresses, or those taking claims, changed; whether they did."""
        found = targets(view)
        if self._process is None or found == (self._routes.nodes, self._routes.claiming):
            return False
        self._write(*found)
        self._process.send_signal(signal.SIGHUP)  # new workers take new calls; the old ones finish theirs
        log.info("edge: nodes now %s; taking claims: %s", ", ".join(
            f"{name} at {address}" for name, address in sorted(self._routes.nodes.items())),
            ", ".join(self._routes.claiming) or "none")
        return True

    async def follow_calls(self, metrics: Metrics, withdraw: Withdraw) -> None:
        """Counts and logs each command and claim nginx passed to a node, as the router's routes do theirs, and has
        `withdraw` the claims nginx may have left made for nobody (`undelivered`), until cancelled."""
        loop = asyncio.get_running_loop()
        # the transport reads, and closes, a copy: the pipe keeps a reader of its own until nginx is gone
        transport, _ = await loop.connect_read_pipe(lambda: _CallLines(metrics, withdraw),
                                                    os.fdopen(os.dup(self._reader), "rb"))
        try:
            await asyncio.Future()
        finally:
            transport.close()

    def close(self) -> None:
        """Stops nginx, then closes the pipe: nginx opens the pipe again when it loads its configuration, and that
        open waits, with nginx's signals held, until someone reads it."""
        if self._process is not None:
            self._process.send_signal(signal.SIGQUIT)  # finish the calls under way
            try:
                self._process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)  # its workers too
                self._process.wait()
        for fd in (self._reader, self._keeper):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(self.root, ignore_errors=True)

    def errors(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "error.log").read_text(errors="replace")[-2000:]
        return ""

    def _open_calls(self) -> None:
        """The pipe nginx writes its lines to (CALLS), read by `follow_calls`. The router holds its write end too,
        so that the read end never ends while nginx loads its configuration again."""
        fifo = self.root / CALLS
        os.mkfifo(fifo, 0o600)
        self._reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self._keeper = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        with contextlib.suppress(OSError):  # a bigger pipe keeps nginx from waiting on a busy router
            fcntl.fcntl(self._reader, fcntl.F_SETPIPE_SZ, PIPE_SIZE)

    def _write(self, nodes: dict[str, str], claiming: tuple[str, ...]) -> None:
        self._routes = replace(self._routes, nodes=nodes, claiming=claiming)
        written = self.root / "nginx.conf.new"
        written.touch(mode=0o600)
        written.write_text(render(self._routes, self.root))
        written.replace(self._config)


def undelivered(call: Mapping[str, str]) -> list[tuple[str, str]]:
    """The nodes (their URLs) that may have made a claim nginx logged (the `rollbox_call` format) for nobody, with
    the attempt to withdraw there: each node it was tried on, but the one whose answer reached the caller, and those
    that refused it (404 no warm sandbox, 429 full, 503). The router's own placement, after nginx's turn (after
    " : "), withdraws its own."""
    tried = call["upstreams"].split(" : ")[0].split(", ")
    statuses = call["statuses"].split(" : ")[0].split(", ")
    delivered = _claimed_by_a_node(call)
    found = []
    for index, (address, status) in enumerate(zip(tried, statuses, strict=False)):
        if status in REFUSED or (delivered and index == len(tried) - 1) or ":" not in address:
            continue  # refused, delivered, or no node at all ("no live upstreams" names the group)
        found.append((f"http://{address}", call["attempt"]))
    return found


def _claimed_by_a_node(call: Mapping[str, str]) -> bool:
    """Whether a node's 201 reached the claim's caller: nginx's turn ended there, the router not asked (" : ")."""
    return call["status"] == "201" and " : " not in call["upstreams"]


class _CallLines(asyncio.Protocol):
    """nginx's lines (the `rollbox_call` log format) about the commands and claims it passed to nodes, recorded in
    the router's metrics and command log; claims left for nobody withdrawn."""

    def __init__(self, metrics: Metrics, withdraw: Withdraw) -> None:
        self.metrics = metrics
        self.withdraw = withdraw
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            try:
                self._record(json.loads(line))
            except Exception:
                log.exception("edge: cannot read nginx's line: %r", line[:500])

    def _record(self, call: dict[str, str]) -> None:
        seconds = float(call["seconds"]) if call["seconds"].replace(".", "", 1).isdigit() else 0.0
        path = call["uri"].partition("?")[0]
        if path == "/v1/sandboxes":
            for url, attempt in undelivered(call):
                self.withdraw(url, attempt)
            if _claimed_by_a_node(call):  # the router counts those it placed
                self.metrics.record_claim(seconds)
            return
        sandbox_id = path.removeprefix("/v1/sandboxes/").partition("/")[0]
        if call["method"] == "DELETE":  # its commands leave the log, as the router's own delete does
            if call["status"] == "204":
                self.metrics.activity.commands.drop(sandbox_id)
            return
        body = json.loads(call["body"]) if call["body"] else {}  # a body too long for memory stayed in nginx's file
        self.metrics.execs.inc()
        self.metrics.record_exec(call["tenant"], sandbox_id, body.get("command", "?"),
                                 int(call["exit_code"]) if call["exit_code"] else None, seconds)


def _address(listener: sockets.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"[{host}]:{port}" if listener.family == sockets.AF_INET6 else f"{host}:{port}"


def _die_with_parent() -> None:
    """nginx goes when the router does, even killed: it must not keep the router's port."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
