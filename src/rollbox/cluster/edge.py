"""The router's edge: nginx in front of the router's routes, passing an episode's calls (a warm claim, a command run,
a file read or written, the sandbox's description, stats and deletion) straight to the nodes, and every other call
to the router.

A hop that parses HTTP in Python costs more on a command than the router may add to it (docs/cluster.md, "What a hop
costs"); nginx forwards at the cost of copying bytes. It decides nothing the router would decide otherwise: a call
goes straight to a node only when nginx knows the caller's token exactly and the node the sandbox's id names (see
`render`); anything else, a call whose node it could not reach included, goes to the router, which answers as it
always does. So the router's answers stay the API's, and the edge only makes the common case faster.

The router writes nginx's configuration from its tokens and its view of the nodes, and has nginx load it again
(SIGHUP) when a node's address changes or a node starts or stops taking claims. nginx serves on the router's
listening socket, which it inherits; the router itself listens on a loopback port of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket as sockets
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from rollbox.cluster.view import NodeState
from rollbox.errors import ConnectionFailed, NodeUnavailable, RollboxError
from rollbox.models import ErrorBody
from rollbox.server.auth import OPEN_TENANT, TENANT_HEADER
from rollbox.server.limits import too_large
from rollbox.server.metrics import Metrics
from rollbox.server.sandboxes import EXIT_CODE_HEADER, WARM_ONLY

log = logging.getLogger("rollbox.cluster")

NGINX = "nginx"
SAFE = re.compile(r"[A-Za-z0-9._~+/=:-]+")
"""Tokens and node names nginx's configuration may hold as they are; calls with others go to the router."""
CALLS = "calls.fifo"
"""The pipe nginx writes a line to for each command, claim and deletion it passed to a node."""
PIPE_SIZE = 1 << 20
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
COMMAND_WAIT = "1d"
"""How long nginx waits for a node's answer: a command may run that long (the router waits as long as it runs)."""
CONNECT_TIMEOUT = "2s"
"""How long nginx tries to reach a node before the call goes to the router, which waits for the node to be back."""
_PR_SET_PDEATHSIG = 1


def available() -> str | None:
    """nginx's path, when it is installed."""
    return shutil.which(NGINX)


@dataclass(frozen=True)
class Routes:
    """What nginx's configuration is made of."""

    listen: str
    """The address nginx serves on, as nginx writes it (`127.0.0.1:8080`, `[::1]:8080`)."""
    router: str
    """The router's own address (`127.0.0.1:PORT`)."""
    secret: str
    tokens: Mapping[str, str] | None
    """Each tenant's token; None or empty for an open router, whose every caller is the tenant `default`."""
    max_body: int
    nodes: Mapping[str, str] = field(default_factory=dict)
    """Each node's name and its agent's address (`host:port`)."""
    claiming: tuple[str, ...] = ()
    """The nodes that take new claims (of `nodes`)."""


def targets(view: Mapping[str, NodeState]) -> tuple[dict[str, str], tuple[str, ...]]:
    """From the router's view: the nodes a call may go to straight, and those a warm claim may try.

    A call on a sandbox may go to every node with an address that has not left the cluster. A node whose agent does
    not answer stays: a call to it that finds nobody listening goes to the router, which waits for it. A claim may
    try the nodes that are up (not those joining, whose templates are still being copied)."""
    nodes = {}
    for name, node in view.items():
        if node.status != "lost" and node.url is not None and node.url.startswith("http://") and SAFE.fullmatch(name):
            nodes[name] = node.url.removeprefix("http://").rstrip("/")
    return nodes, tuple(sorted(name for name in nodes if view[name].status == "up"))


def render(routes: Routes, root: Path) -> str:
    """nginx's configuration. The maps decide, for each call, where it goes:

    - `$rollbox_tenant`: the tenant of an `Authorization: Bearer TOKEN` nginx knows (case-sensitive regular
      expressions: nginx matches plain strings in any case); empty for any other, which the router then judges;
    - `$rollbox_node`: the node named by the id of a call the router would only pass on to it (a command run, a
      file read or written, the sandbox described, its stats, its deletion), the id up to its last `-` as the
      router reads it, from the request's path as sent, so an encoded or dotted path never matches;
    - `$rollbox_upstream`: that node's agent when both are known, else the router;
    - `$rollbox_claim_upstream`: for a claim of a known tenant, the nodes that take claims, tried in turn for a
      ready warm sandbox (`warm_only`, server/sandboxes.py); a claim none can take warm goes to the router, which
      places it as it always does (a cold start, a snapshot, volumes).
    """
    tenants = "\n".join(f'    "~^Bearer {_regex(token)}$" {tenant};'
                        for tenant, token in sorted((routes.tokens or {}).items())
                        if SAFE.fullmatch(token) and SAFE.fullmatch(tenant))
    names = sorted(routes.nodes)
    upstreams = [f"  upstream rollbox_node_{index} {{ server {routes.nodes[name]}; {_KEEPALIVE} }}"
                 for index, name in enumerate(names)]
    claim_map = ""
    if routes.claiming:
        servers = " ".join(f"server {routes.nodes[name]} max_fails=0;" for name in routes.claiming)
        upstreams.append(f"  upstream rollbox_claims {{ {servers} {_KEEPALIVE} }}")  # in turn, as the router spreads
        claim_map = '    "~^POST\\|." rollbox_claims;'
    return _CONFIG.format(
        root=root, listen=routes.listen, router=routes.router, keepalive=_KEEPALIVE, upstreams="\n".join(upstreams),
        tenants=tenants, open_default=OPEN_TENANT if not routes.tokens else '""', secret=routes.secret,
        node_map="\n".join(f'    "~^{_regex(name)}$" rollbox_node_{index};' for index, name in enumerate(names)),
        claim_map=claim_map, warm_only=f"/v1/sandboxes?{WARM_ONLY.name}=true", tenant_header=TENANT_HEADER,
        wait=COMMAND_WAIT, connect=CONNECT_TIMEOUT, max_body=routes.max_body,
        too_large=_json(too_large(routes.max_body)),
        dropped=_json(NodeUnavailable("node $rollbox_node stopped answering during the call: the sandbox's state is "
                                      "unknown; check it, or try again")),
        gone=_json(ConnectionFailed("the router behind nginx does not answer: it is stopping or starting; try again "
                                    "shortly")),
        exit_header=EXIT_CODE_HEADER.replace("-", "_"), calls=CALLS)


def _regex(text: str) -> str:
    """`text` (SAFE) as a PCRE that matches only it."""
    return re.sub(r"([.+])", r"\\\1", text)


def _json(error: RollboxError) -> str:
    """An nginx `return` of the API's answer to `error` (in a location whose default_type is JSON)."""
    body = ErrorBody.of(error.code, str(error)).model_dump_json().replace("\\", "\\\\").replace("'", "\\'")
    return f"return {error.status} '{body}';"


_KEEPALIVE = "keepalive 256; keepalive_requests 1000000000; keepalive_timeout 60s;"
"""Kept-alive connections to a node or the router: closed by nginx before the other side's 75 s run out."""

_CONFIG = """\
# Written by rollbox's router (rollbox/cluster/edge.py), which loads it again when nodes come and go.
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  server_tokens off;
  client_body_temp_path {root}/body;
  proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fastcgi;
  uwsgi_temp_path {root}/uwsgi;
  scgi_temp_path {root}/scgi;
  keepalive_timeout 75s;
  keepalive_requests 1000000000;
  client_body_buffer_size 1m;
  tcp_nodelay on;
  proxy_http_version 1.1;
  proxy_buffering off;
  proxy_read_timeout {wait};
  proxy_send_timeout {wait};
  proxy_connect_timeout {connect};

  upstream rollbox_router {{ server {router}; {keepalive} }}
{upstreams}

  map $http_authorization $rollbox_tenant {{
    default {open_default};
{tenants}
  }}
  map "$request_method $request_uri" $rollbox_node {{
    default "";
    "~^POST /v1/sandboxes/([A-Za-z0-9._~+=:-]*)-[A-Za-z0-9._~+=:]+/exec$" $1;
    "~^(?:GET|PUT) /v1/sandboxes/([A-Za-z0-9._~+=:-]*)-[A-Za-z0-9._~+=:]+/files(?:\\?[^#]*)?$" $1;
    "~^(?:GET|DELETE) /v1/sandboxes/([A-Za-z0-9._~+=:-]*)-[A-Za-z0-9._~+=:]+$" $1;
    "~^GET /v1/sandboxes/([A-Za-z0-9._~+=:-]*)-[A-Za-z0-9._~+=:]+/stats$" $1;
  }}
  map $rollbox_node $rollbox_node_upstream {{
    default "";
{node_map}
  }}
  map "$rollbox_tenant|$rollbox_node_upstream" $rollbox_upstream {{
    default rollbox_router;
    "~^[^|]+\\|(rollbox_node_[0-9]+)$" $1;
  }}
  map $rollbox_upstream $rollbox_authorization {{
    rollbox_router $http_authorization;
    default "Bearer {secret}";
  }}
  map $rollbox_upstream $rollbox_acting_for {{
    rollbox_router "";
    default $rollbox_tenant;
  }}
  map "$request_method|$rollbox_upstream" $rollbox_logged {{
    "~^(?:POST|DELETE)\\|rollbox_node_" 1;
    default 0;
  }}
  map "$request_method|$rollbox_tenant" $rollbox_claim_upstream {{
    default rollbox_router;
{claim_map}
  }}
  map $rollbox_claim_upstream $rollbox_claim_target {{
    rollbox_router $request_uri;
    default {warm_only};
  }}
  map $rollbox_claim_upstream $rollbox_claim_authorization {{
    rollbox_router $http_authorization;
    default "Bearer {secret}";
  }}
  map $rollbox_claim_upstream $rollbox_claim_acting_for {{
    rollbox_router "";
    default $rollbox_tenant;
  }}
  map "$rollbox_claim_upstream|$status" $rollbox_claimed {{
    "rollbox_claims|201" 1;
    default 0;
  }}
  log_format rollbox_call escape=json
    '{{"method":"$request_method","tenant":"$rollbox_tenant","uri":"$request_uri","body":"$request_body",'
    '"status":"$status","exit_code":"$upstream_http_{exit_header}","seconds":"$upstream_response_time"}}';
  map $http_upgrade $rollbox_connection {{
    default upgrade;
    "" "";
  }}

  server {{
    listen {listen} backlog=2048;
    recursive_error_pages on;

    location ~ ^/v1/sandboxes/[^/]+(?:/(?:exec|files|stats))?$ {{
      client_max_body_size {max_body};
      error_page 413 = @too_large;
      error_page 502 504 = @unreached;
      access_log {root}/{calls} rollbox_call if=$rollbox_logged;
      proxy_pass http://$rollbox_upstream;
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_set_header Authorization $rollbox_authorization;
      proxy_set_header {tenant_header} $rollbox_acting_for;
    }}
    location @unreached {{
      default_type application/json;
      # Nothing reached the node: the router takes the call, and waits for the node if it is restarting.
      # Something did: the node may have run it, so it is not sent again.
      if ($upstream_bytes_sent != "0") {{ {dropped} }}
      error_page 502 504 = @router_gone;
      proxy_pass http://rollbox_router;
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_set_header {tenant_header} "";
    }}
    location = /v1/sandboxes {{
      # A claim: the nodes that take claims, in turn, until one has a warm sandbox for it; then the router.
      client_max_body_size {max_body};
      error_page 413 = @too_large;
      proxy_next_upstream error timeout http_503 http_429 non_idempotent;
      proxy_intercept_errors on;
      error_page 502 503 504 = @claimed_by_router;
      access_log {root}/{calls} rollbox_call if=$rollbox_claimed;
      proxy_pass http://$rollbox_claim_upstream$rollbox_claim_target;
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_set_header Authorization $rollbox_claim_authorization;
      proxy_set_header {tenant_header} $rollbox_claim_acting_for;
    }}
    location @claimed_by_router {{
      error_page 502 504 = @router_gone;
      proxy_pass http://rollbox_router;
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_set_header {tenant_header} "";
    }}
    location @too_large {{ default_type application/json; {too_large} }}
    location @router_gone {{ default_type application/json; {gone} }}
    location / {{
      client_max_body_size 0;
      error_page 502 504 = @router_gone;
      proxy_request_buffering off;
      proxy_pass http://rollbox_router;
      proxy_set_header Host $http_host;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $rollbox_connection;
      proxy_set_header {tenant_header} "";
    }}
  }}
}}
"""


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

    async def follow_calls(self, metrics: Metrics) -> None:
        """Counts and logs each command and claim nginx passed to a node, as the router's routes do theirs, until
        cancelled."""
        loop = asyncio.get_running_loop()
        # the transport reads, and closes, a copy: the pipe keeps a reader of its own until nginx is gone
        transport, _ = await loop.connect_read_pipe(lambda: _CallLines(metrics), os.fdopen(os.dup(self._reader), "rb"))
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


class _CallLines(asyncio.Protocol):
    """nginx's lines (the `rollbox_call` log format) about the commands and claims it passed to nodes, recorded in
    the router's metrics and command log."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
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
