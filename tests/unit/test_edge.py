"""The router's edge without nginx running: which nodes its configuration names, how it knows tokens, and how the
router reads nginx's lines (tests/cluster/test_cluster_edge.py runs the real thing)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from rollbox.cluster.edge import _CallLines, undelivered
from rollbox.cluster.edge_config import FAIL_TIMEOUT, WARM_WAIT, Routes, render, targets
from rollbox.cluster.view import RESTART_WAIT, NodeState
from rollbox.server.metrics import Metrics

SECRET = "s" * 32


def node(name: str, status: str, url: str | None = "http://10.0.0.1:7000", since: float = 0.0) -> NodeState:
    return NodeState(name, url, status, since)  # type: ignore[arg-type]


def test_calls_go_to_every_node_neither_lost_nor_down_and_claims_to_those_up() -> None:
    """A node that stopped answering a moment ago may be restarting: its calls try it, then wait at the router. One
    down for RESTART_WAIT has its calls answered by the router at once."""
    view = {state.name: state for state in (
        node("up-a", "up", "http://10.0.0.1:7000/"), node("joining", "joining", "http://10.0.0.2:7000"),
        node("unreachable", "unreachable", "http://10.0.0.3:7000", time.monotonic()),
        node("down", "unreachable", "http://10.0.0.5:7000", time.monotonic() - RESTART_WAIT), node("lost", "lost"),
        node("starting", "up", None), node("tls", "up", "https://10.0.0.4:7000"), node('bad"name', "up"))}
    nodes, claiming = targets(view)
    assert nodes == {"up-a": "10.0.0.1:7000", "joining": "10.0.0.2:7000", "unreachable": "10.0.0.3:7000"}
    assert claiming == ("up-a",)


def test_warm_claims_try_each_node_briefly_and_claims_sent_again_go_to_the_router() -> None:
    """A frozen node holds a claim up WARM_WAIT at most, and leaves the turn for FAIL_TIMEOUT; a claim sent again
    (`retry`) goes to the router, which asks every node for its request key."""
    config = render(Routes("127.0.0.1:8080", "127.0.0.1:9000", SECRET, {"alice": "alice-token"}, 1024,
                           {"w0": "10.0.0.1:7000", "w1": "10.0.0.2:7000"}, ("w0", "w1")), Path("/run/edge"))
    ways = map_keys(config, "rollbox_claim_way")

    def way(method: str, retry: str = "") -> str:
        return next((value for pattern, value in ways.items() if re.search(pattern, f"{method}|alice|{retry}")),
                    "router")

    assert (way("POST"), way("POST", "true"), way("GET")) == ("warm", "router", "router")
    warm = config[config.index("location = /.rollbox/warm-claim"):]
    warm = warm[:warm.index("}")]
    for setting in (f"proxy_read_timeout {WARM_WAIT};", f"proxy_connect_timeout {WARM_WAIT};",
                    "proxy_next_upstream error timeout http_404",
                    "error_page 404 429 502 503 504 = @claimed_by_router"):
        assert setting in warm, setting
    assert (f"server 10.0.0.1:7000 max_fails=1 fail_timeout={FAIL_TIMEOUT}; "
            f"server 10.0.0.2:7000 max_fails=1 fail_timeout={FAIL_TIMEOUT};") in config


def map_keys(config: str, variable: str) -> dict[str, str]:
    """The regular expressions of one of the configuration's maps, and what each maps to."""
    block = re.search(rf'map (?:"[^"]*"|\S+) \${variable} {{\n(.*?)\n  }}', config, re.S)
    assert block is not None, variable
    keys = {}
    for line in block.group(1).splitlines():
        found = re.fullmatch(r'\s+"~(.*)" (\S+);', line)
        if found:
            keys[found.group(1)] = found.group(2)
    return keys


def tenant_of(config: str, authorization: str) -> str | None:
    return next((tenant for pattern, tenant in map_keys(config, "rollbox_tenant").items()
                 if re.search(pattern, authorization)), None)


def test_a_token_is_known_by_its_exact_bytes_only() -> None:
    tokens = {"alice": "Ab.c+d/e=f~g:h-i_j", "bob": "bob-token", "eve": 'has"quote', "mallory": "has space"}
    config = render(Routes("127.0.0.1:8080", "127.0.0.1:9000", SECRET, tokens, 1024), Path("/run/edge"))
    assert tenant_of(config, "Bearer Ab.c+d/e=f~g:h-i_j") == "alice"
    assert tenant_of(config, "Bearer bob-token") == "bob"
    for wrong in ("Bearer ab.c+d/e=f~g:h-i_j", "Bearer AbXc+d/e=f~g:h-i_j", "Bearer Ab.cd/e=f~g:h-i_j",
                  "Bearer bob-tokenx", "Bearer BOB-TOKEN", "bearer bob-token", "Bearer  bob-token", "bob-token"):
        assert tenant_of(config, wrong) is None, wrong
    assert "quote" not in config and "has space" not in config  # left to the router, which knows them
    assert re.search(r"map \$http_authorization \$rollbox_tenant {\n    default \"\";", config)


def test_an_open_router_names_every_caller_default() -> None:
    config = render(Routes("127.0.0.1:8080", "127.0.0.1:9000", SECRET, None, 1024), Path("/run/edge"))
    assert re.search(r"map \$http_authorization \$rollbox_tenant {\n    default default;", config)


def test_ids_name_their_nodes_as_the_router_reads_them() -> None:
    routes = Routes("127.0.0.1:8080", "127.0.0.1:9000", SECRET, None, 1024,
                    {"w-1": "10.0.0.1:7000", "w.2": "10.0.0.2:7000"}, ("w-1",))
    config = render(routes, Path("/run/edge"))
    calls = map_keys(config, "rollbox_node")
    upstreams = map_keys(config, "rollbox_node_upstream")

    def upstream(request: str) -> str | None:
        name = next((re.sub(r"\$1", found.group(1), value) for pattern, value in calls.items()
                     if (found := re.search(pattern, request))), None)
        return None if name is None else next((value for pattern, value in upstreams.items()
                                               if re.search(pattern, name)), None)

    assert upstream("POST /v1/sandboxes/w-1-9f3c/exec") == "rollbox_node_0"
    assert upstream("GET /v1/sandboxes/w.2-9f3c/files?path=/tmp/x") == "rollbox_node_1"
    assert upstream("PUT /v1/sandboxes/w-1-9f3c/files?path=/tmp/x&mode=420") == "rollbox_node_0"
    assert upstream("GET /v1/sandboxes/w-1-9f3c") == upstream("DELETE /v1/sandboxes/w-1-9f3c") == "rollbox_node_0"
    assert upstream("GET /v1/sandboxes/w.2-9f3c/stats") == "rollbox_node_1"
    for elsewhere in ("POST /v1/sandboxes/wX2-9f3c/exec", "POST /v1/sandboxes/w-1-9f3c/exec/stream",
                      "GET /v1/sandboxes/w-1-9f3c/exec", "POST /v1/sandboxes/w-1-9f3c%2F..%2Fx/exec",
                      "POST /v1/sandboxes/../w-1-9f3c/exec", "DELETE /v1/sandboxes/w-1-9f3c/files?path=/x",
                      "POST /v1/sandboxes/w-1/exec", "POST /v1/sandboxes/w-3-9f3c/exec",
                      "POST /v1/sandboxes/w-1-9f3c", "GET /v1/sandboxes/w-1-9f3c/",
                      "DELETE /v1/sandboxes/w-1-9f3c/stats", "GET /v1/sandboxes/w-1-9f3c?x=1",
                      "POST /v1/sandboxes/w-1-9f3c/fork"):
        assert upstream(elsewhere) is None, elsewhere
    assert "upstream rollbox_claims { server 10.0.0.1:7000 max_fails=1" in config
    assert "10.0.0.2:7000 max_fails" not in config  # w.2 takes no claims
    assert f"Bearer {SECRET}" in config


def test_the_router_counts_and_logs_what_nginx_passed_on() -> None:
    metrics = Metrics()
    withdrawn: list[tuple[str, str]] = []
    lines = _CallLines(metrics, lambda url, attempt: withdrawn.append((url, attempt)))
    command = ('{"method":"POST","tenant":"alice","uri":"/v1/sandboxes/w-1-9f3c/exec",'
               '"body":"{\\"command\\": \\"exit 3\\"}","status":"200","exit_code":"3","seconds":"0.004"}\n')
    claim = ('{"method":"POST","tenant":"bob","uri":"/v1/sandboxes","body":"{\\"warmpool\\": \\"p\\"}","status":"201",'
             '"exit_code":"","seconds":"0.001","attempt":"a1","upstreams":"10.0.0.1:7000, 10.0.0.2:7000",'
             '"statuses":"504, 201"}\n')
    unreadable = "not a line nginx writes\n"
    data = (command + claim + unreadable + command).encode()
    lines.data_received(data[:50])  # lines arrive in pieces
    lines.data_received(data[50:])
    assert metrics.execs._value.get() == 2 and metrics.claims._value.get() == 1
    assert withdrawn == [("http://10.0.0.1:7000", "a1")]  # nginx stopped waiting for the first node
    logged = metrics.activity.commands.tail("w-1-9f3c")
    assert [(entry["command"], entry["exit_code"], entry["tenant"]) for entry in logged] == [("exit 3", 3, "alice")] * 2
    lines.data_received(b'{"method":"DELETE","tenant":"alice","uri":"/v1/sandboxes/w-1-9f3c","body":"",'
                        b'"status":"409","exit_code":"","seconds":"0.001"}\n')
    assert len(metrics.activity.commands.tail("w-1-9f3c")) == 2  # not deleted: still there
    lines.data_received(b'{"method":"DELETE","tenant":"alice","uri":"/v1/sandboxes/w-1-9f3c","body":"",'
                        b'"status":"204","exit_code":"","seconds":"0.001"}\n')
    assert metrics.activity.commands.tail("w-1-9f3c") == [] and metrics.execs._value.get() == 2


def claim_line(status: str, upstreams: str, statuses: str) -> dict[str, str]:
    return {"method": "POST", "uri": "/v1/sandboxes", "tenant": "t", "status": status, "attempt": "r1",
            "upstreams": upstreams, "statuses": statuses}


def test_a_claim_is_withdrawn_on_every_node_nginx_tried_that_may_have_made_it_for_nobody() -> None:
    """A node that refused (404 no warm sandbox, 429, 503) made nothing, and the one whose 201 reached the caller
    holds it; any other may have made one: nginx stopped waiting (504), lost the connection (502), or its caller
    left (499)."""
    a, b, c = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"
    assert undelivered(claim_line("201", f"{a}, {b}, {c}", "404, 504, 201")) == [(f"http://{b}", "r1")]
    assert undelivered(claim_line("201", f"{a}", "201")) == []
    # none took it warm: the router placed it (after " : "), and withdraws its own attempts
    assert undelivered(claim_line("201", f"{a}, {b} : 127.0.0.1:9000", "502, 404 : 201")) == [(f"http://{a}", "r1")]
    # the caller left while a node made it
    assert undelivered(claim_line("499", f"{a}", "-")) == [(f"http://{a}", "r1")]
    assert undelivered(claim_line("499", f"{a}", "201")) == [(f"http://{a}", "r1")]
    # every node out of the turn: nginx names its group, no node
    assert undelivered(claim_line("201", "rollbox_claims : 127.0.0.1:9000", "502 : 201")) == []


def test_only_claims_a_node_answered_count_as_nginx_s() -> None:
    """The router counts the claims it placed itself."""
    metrics = Metrics()
    lines = _CallLines(metrics, lambda url, attempt: None)
    for status, upstreams, statuses in (("201", "10.0.0.1:7000 : 127.0.0.1:9000", "404 : 201"),
                                        ("503", "10.0.0.1:7000", "503")):
        lines.data_received(json.dumps({**claim_line(status, upstreams, statuses), "body": "", "exit_code": "",
                                        "seconds": "0.001"}).encode() + b"\n")
    assert metrics.claims._value.get() == 0
