"""What the router's edge tells nginx (edge.py runs it): its configuration, written from the router's tokens and
its view of the nodes.

A call goes straight to a node only when nginx knows the caller's token exactly and the node the sandbox's id
names (see `render`); anything else goes to the router.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rollbox.cluster.view import NodeState
from rollbox.errors import ConnectionFailed, NodeUnavailable, RollboxError
from rollbox.models import ErrorBody
from rollbox.server.auth import OPEN_TENANT, TENANT_HEADER
from rollbox.server.limits import too_large
from rollbox.server.sandboxes import ATTEMPT_HEADER, EXIT_CODE_HEADER, WARM_ONLY

SAFE = re.compile(r"[A-Za-z0-9._~+/=:-]+")
"""Tokens and node names nginx's configuration may hold as they are; calls with others go to the router."""
CALLS = "calls.fifo"
"""The pipe nginx writes a line to for each command, claim and deletion it passed to a node."""
COMMAND_WAIT = "1d"
"""How long nginx waits for a node's answer: a command may run that long (the router waits as long as it runs)."""
CONNECT_TIMEOUT = "2s"
"""How long nginx tries to reach a node before the call goes to the router, which waits for the node to be back."""
WARM_WAIT = "500ms"
"""How long a node has to connect to and answer a warm-only claim before nginx asks the next: a node's warm claim
takes a millisecond, so one that takes this long is frozen or swamped (docs/faults.md)."""
FAIL_TIMEOUT = "2s"
"""How long nginx leaves a node out of the warm claims' turn after it failed one (no connection, or no answer in
WARM_WAIT): a node that stops answering leaves the rotation at once, not only when the router notices."""


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

    A call on a sandbox may go to every node with an address that has not left the cluster and is not down. A node
    whose agent stopped answering a moment ago stays: a call to it that finds nobody listening goes to the router,
    which waits for it a little (RESTART_WAIT). A down node's calls go to the router, which answers them at once. A
    claim may try the nodes that are up (not those joining, whose templates are still being copied)."""
    nodes = {}
    now = time.monotonic()
    for name, node in view.items():
        if (node.status != "lost" and not node.down(now) and node.url is not None and node.url.startswith("http://")
                and SAFE.fullmatch(name)):
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
    - `$rollbox_claim_way`: for a claim of a known tenant, the nodes that take claims, tried in turn for a
      ready warm sandbox (`warm_only`, server/sandboxes.py), each within WARM_WAIT; a claim none can take warm goes
      to the router, which places it as it always does (a cold start, a snapshot, volumes), and so does a claim
      sent again (`retry`): the router asks every node for its request key first.
    """
    tenants = "\n".join(f'    "~^Bearer {_regex(token)}$" {tenant};'
                        for tenant, token in sorted((routes.tokens or {}).items())
                        if SAFE.fullmatch(token) and SAFE.fullmatch(tenant))
    names = sorted(routes.nodes)
    upstreams = [f"  upstream rollbox_node_{index} {{ server {routes.nodes[name]}; {_KEEPALIVE} }}"
                 for index, name in enumerate(names)]
    claim_map, warm_claims = "", ""
    if routes.claiming:
        servers = " ".join(f"server {routes.nodes[name]} max_fails=1 fail_timeout={FAIL_TIMEOUT};"
                            for name in routes.claiming)
        upstreams.append(f"  upstream rollbox_claims {{ {servers} {_KEEPALIVE} }}")  # in turn, as the router spreads
        claim_map = '    "~^POST\\|[^|]+\\|$" warm;'
        warm_claims = _WARM_CLAIMS.format(root=root, calls=CALLS, max_body=routes.max_body, wait=WARM_WAIT,
                                          warm_only=f"/v1/sandboxes?{WARM_ONLY.name}=true", secret=routes.secret,
                                          tenant_header=TENANT_HEADER, attempt_header=ATTEMPT_HEADER)
    return _CONFIG.format(
        root=root, listen=routes.listen, router=routes.router, keepalive=_KEEPALIVE, upstreams="\n".join(upstreams),
        tenants=tenants, open_default=OPEN_TENANT if not routes.tokens else '""', secret=routes.secret,
        node_map="\n".join(f'    "~^{_regex(name)}$" rollbox_node_{index};' for index, name in enumerate(names)),
        claim_map=claim_map, warm_claims=warm_claims, tenant_header=TENANT_HEADER,
        wait=COMMAND_WAIT, connect=CONNECT_TIMEOUT, max_body=routes.max_body,
        too_large=_json(too_large(routes.max_body)),
        dropped=_json(NodeUnavailable("node $rollbox_node stopped answering during the call: the sandbox's state is "
                                      "unknown; check it, or try again")),
        gone=_json(ConnectionFailed("the router behind nginx does not answer: it is stopping or starting; try again "
                                    "shortly")),
        exit_header=EXIT_CODE_HEADER.replace("-", "_"), calls=CALLS,
        to_router_as_sent=_TO_ROUTER_AS_SENT.format(tenant_header=TENANT_HEADER))


def _regex(text: str) -> str:
    """`text` (SAFE) as a PCRE that matches only it."""
    return re.sub(r"([.+])", r"\\\1", text)


def _json(error: RollboxError) -> str:
    """An nginx `return` of the API's answer to `error` (in a location whose default_type is JSON)."""
    body = ErrorBody.of(error.code, str(error), error.retry).dumped().decode().replace("\\", "\\\\").replace("'", "\\'")
    return f"return {error.status} '{body}';"


_TO_ROUTER_AS_SENT = """\
      error_page 502 504 = @router_gone;
      proxy_request_buffering off;
      proxy_pass http://rollbox_router;
      proxy_set_header Host $http_host;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $rollbox_connection;
      proxy_set_header {tenant_header} "";"""
"""To the router, body streamed and WebSockets upgraded: everything nginx does not pass to a node itself."""

_KEEPALIVE = "keepalive 256; keepalive_requests 1000000000; keepalive_timeout 60s;"
"""Kept-alive connections to a node or the router: closed by nginx before the other side's 75 s run out."""

_CONFIG = """\
# Written by rollbox's router (rollbox/cluster/edge_config.py), which loads it again when nodes come and go.
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
    "~^[A-Z]+ /v1/sandboxes/([A-Za-z0-9._~+=:-]*)-[A-Za-z0-9._~+=:]+/(?:ports|tunnel)/[0-9]+(?:[/?][^#]*)?$" $1;
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
  map "$request_method|$rollbox_tenant|$arg_retry" $rollbox_claim_way {{
    default router;
{claim_map}
  }}
  log_format rollbox_call escape=json
    '{{"method":"$request_method","tenant":"$rollbox_tenant","uri":"$request_uri","body":"$request_body",'
    '"status":"$status","exit_code":"$upstream_http_{exit_header}","seconds":"$upstream_response_time",'
    '"attempt":"$request_id","upstreams":"$upstream_addr","statuses":"$upstream_status"}}';
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
    location ~ ^/v1/sandboxes/[^/]+/(?:ports|tunnel)/[0-9]+(?:/|$) {{
      # Traffic to a sandbox's port (docs/ports.md): with a token nginx knows, straight to the sandbox's node, as
      # it comes (bodies streamed both ways, WebSockets upgraded); with a traffic token, to the router.
      client_max_body_size {max_body};
      error_page 413 = @too_large;
      error_page 502 504 = @port_unreached;
      proxy_request_buffering off;
      proxy_pass http://$rollbox_upstream;
      proxy_set_header Host $http_host;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $rollbox_connection;
      proxy_set_header Authorization $rollbox_authorization;
      proxy_set_header {tenant_header} $rollbox_acting_for;
    }}
    location @port_unreached {{
      default_type application/json;
      if ($upstream_bytes_sent != "0") {{ {dropped} }}
{to_router_as_sent}
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
      if ($rollbox_claim_way = warm) {{ rewrite ^ /.rollbox/warm-claim? last; }}
      client_max_body_size {max_body};
      error_page 413 = @too_large;
      error_page 502 504 = @router_gone;
      proxy_pass http://rollbox_router;
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_set_header {tenant_header} "";
    }}
{warm_claims}    location @claimed_by_router {{
      access_log {root}/{calls} rollbox_call;
      error_page 502 504 = @router_gone;
      proxy_pass http://rollbox_router$request_uri;
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_set_header {tenant_header} "";
    }}
    location @too_large {{ default_type application/json; {too_large} }}
    location @router_gone {{ default_type application/json; {gone} }}
    location / {{
      client_max_body_size 0;
{to_router_as_sent}
    }}
  }}
}}
"""

_WARM_CLAIMS = """\
    location = /.rollbox/warm-claim {{
      internal;
      client_max_body_size {max_body};
      error_page 413 = @too_large;
      proxy_connect_timeout {wait};
      proxy_read_timeout {wait};
      proxy_send_timeout {wait};
      proxy_next_upstream error timeout http_404 http_429 http_503 non_idempotent;
      proxy_intercept_errors on;
      error_page 404 429 502 503 504 = @claimed_by_router;
      access_log {root}/{calls} rollbox_call;
      proxy_pass http://rollbox_claims{warm_only};
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_set_header Authorization "Bearer {secret}";
      proxy_set_header {tenant_header} $rollbox_tenant;
      proxy_set_header {attempt_header} $request_id;
    }}
"""
"""The warm claims' location, when some node takes claims: each node within `wait`, a 404 (no warm sandbox there) or
a failure passing the claim to the next, and the router placing what none took. A node that failed (no connection,
no answer in time) leaves the turn for FAIL_TIMEOUT; a 404 does not count as failing. Each claim is logged, with the
nodes it was tried on: a node that may have made it for nobody (nginx stopped waiting for it) has the attempt (the
request's id) withdrawn by the router (edge.py's `undelivered`, node/answers.py)."""
