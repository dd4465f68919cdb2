"""The HTTP API fuzzed: schemathesis against a live `rollbox serve` over real engines, every operation.

Each operation is called as the admin, as a plain tenant, with no token and with an unknown one, with
generated requests (schemathesis's positive and negative data) and with bodies and query values at the
edges of every type. Every answer must be a documented 4xx or a success that matches the document; the
server's log must hold no traceback; and after the first pass has filled the server's caches, an identical
pass must leave its memory where the one before left it (a leak grows every pass).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from rollbox.engine import Engine
from tests.support.engines import BASIC, teardown_engine
from tests.support.servers import wait_until_serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # two to four passes of every operation, 2 to 5 min each

ROLLBOX = Path(sys.executable).with_name("rollbox")
TOKENS = {"alice": "alice-fuzz-token", "bob": "bob-fuzz-token"}
ADMIN = "alice"
CALLERS = {"admin": {"Authorization": f"Bearer {TOKENS['alice']}"},
           "tenant": {"Authorization": f"Bearer {TOKENS['bob']}"},
           "no token": {},
           "unknown token": {"Authorization": "Bearer not-a-known-token"}}
TEMPLATE = {"apiVersion": "rollbox.dev/v1alpha1", "kind": "SandboxTemplate", **BASIC}
POOL = {"kind": "SandboxWarmPool", "metadata": {"name": "basic-pool"},
        "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "basic"}}}
MAX_SANDBOXES = 8
EXAMPLES = 50
"""Generated requests per operation and valid token; callers without one get a few (auth fails first)."""
REQUEST_TIMEOUT = 30.0
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "2"}
"""glibc's thresholds held at their initial values: big buffers are mapped and unmapped, and a freed heap top is
trimmed, so RSS follows what the server holds (by default the thresholds grow with the biggest buffer freed, up
to 32 MiB, and RSS then swings by ~10 MiB from one request to the next). Two arenas: by default each of the
server's worker threads may get its own, and how many it gets depends on how busy the machine is."""
RSS_GROWTH = 10 * 2**20
"""What an identical pass may add to the server's RSS once the first has filled its caches. A pass adds a few MiB
that a later one does not, native caches filling towards their caps (SQLite's page cache, 2 MiB a connection;
allocator arenas), while the Python heap grows by tens of KiB (tracemalloc, before and after four passes). A leak
of 1 KiB a request (a body, an answer or a traceback kept) adds this bound to every pass of ~10,000 requests."""
SETTLING_PASSES = 3
"""Passes after the first that may each look for memory to settle: a leak grows every one of them."""
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


class Server:
    """`rollbox serve` as a child process on a loopback port, its stderr in a file."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir = data_dir
        self.log = log
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        tokens = [arg for tenant, token in TOKENS.items() for arg in ("--token", f"{tenant}={token}")]
        with log.open("wb") as stderr:
            self.process = subprocess.Popen(
                [str(ROLLBOX), "serve", "--data-dir", str(data_dir), "--port", str(port), *tokens,
                 "--admin", ADMIN, "--max-sandboxes", str(MAX_SANDBOXES)],
                stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **STEADY_MALLOC})
        wait_until_serving(self.url, self.process, "rollbox serve")

    def rss(self) -> int:
        """The server process's resident memory, in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        teardown_engine(Engine(self.data_dir))


@dataclass
class Homes:
    """A running sandbox per tenant, so that generated calls on `{sandbox_id}` reach a real one too."""

    http: dict[str, httpx.Client]
    ids: dict[str, str] = field(default_factory=dict)

    def ensure(self) -> None:
        for tenant, http in self.http.items():
            sandbox_id = self.ids.get(tenant)
            answer = http.get(f"/v1/sandboxes/{sandbox_id}") if sandbox_id else None
            if answer is None or answer.status_code == 404:
                created = http.post("/v1/sandboxes", json={"warmpool": "basic-pool"})
                assert created.status_code == 201, created.text
                self.ids[tenant] = created.json()["id"]
            elif answer.json()["state"] == "paused":
                http.post(f"/v1/sandboxes/{sandbox_id}/resume").raise_for_status()
            elif answer.json()["state"] == "stopped":
                http.post(f"/v1/sandboxes/{sandbox_id}/reset").raise_for_status()


@dataclass
class Run:
    """What a fuzzing pass needs: the server, the schema, the callers' clients, the tenants' sandboxes."""

    server: Server
    schema: Any
    homes: Homes
    session: requests.Session
    http: httpx.Client
    log_offset: int = 0
    requests: int = 0

    def new_log(self) -> str:
        """What the server wrote to its stderr since the last call."""
        with self.server.log.open("rb") as log:
            log.seek(self.log_offset)
            written = log.read()
        self.log_offset += len(written)
        return written.decode(errors="replace")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("fuzz")
    server = Server(root / "data", root / "server.log")
    clients = {tenant: httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {token}"})
               for tenant, token in TOKENS.items()}
    try:
        applied = clients[ADMIN].post("/v1/apply", json={"documents": [TEMPLATE, POOL]})
        assert '"done"' in applied.text and '"error"' not in applied.text, applied.text
        homes = Homes(clients)
        homes.ensure()
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        with requests.Session() as session, httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as http:
            yield Run(server, schema, homes, session, http)
        for http in clients.values():
            for sandbox in http.get("/v1/sandboxes").json():
                http.delete(f"/v1/sandboxes/{sandbox['id']}")
            for snapshot in http.get("/v1/snapshots").json():
                http.delete(f"/v1/snapshots/{snapshot['name']}")
    finally:
        for http in clients.values():
            http.close()
        server.stop()


def test_every_fuzzed_request_gets_a_documented_answer_and_memory_stays_flat(run: Run) -> None:
    failures = fuzz(run)
    rss = [run.server.rss()]
    while len(rss) <= SETTLING_PASSES and (len(rss) == 1 or rss[-1] - rss[-2] >= RSS_GROWTH):
        failures += fuzz(run)
        rss.append(run.server.rss())
    shown_rss = ", ".join(f"{r / 2**20:.1f}" for r in rss)
    print(f"{run.requests} requests; server RSS after each pass: {shown_rss} MiB")
    shown = "\n\n".join(map(short_failure, failures[:40]))
    assert not failures, f"{len(failures)} failures, the first ones:\n\n{shown}"
    growths = [f"{(after - before) / 2**20:.1f}" for before, after in itertools.pairwise(rss)]
    assert rss[-1] - rss[-2] < RSS_GROWTH, f"the server's memory grew by {', '.join(growths)} MiB over identical passes"
    time.sleep(2)  # deletes finish in the background
    log = run.new_log()
    assert "Traceback" not in log, f"after the last request, the server's log:\n{log[-3000:]}"


def fuzz(run: Run) -> list[str]:
    """One pass: generated requests for every operation and caller, then the edge values as the admin."""
    failures: list[str] = []
    for result in run.schema.get_all_operations():
        operation = result.ok()
        started, sent = time.monotonic(), run.requests
        for caller, headers in CALLERS.items():
            examples = EXAMPLES if caller in ("admin", "tenant") else 5
            fuzz_operation(run, operation, caller, headers, examples, failures)
        for case, content in edges(run, operation):
            try:
                send(run, case, CALLERS["admin"], content)
            except Exception as failure:
                failures.append(f"{operation.label} at an edge: {type(failure).__name__}: {failure}")
        print(f"{operation.label}: {run.requests - sent} requests in {time.monotonic() - started:.1f} s")
    return failures


def fuzz_operation(run: Run, operation: Any, caller: str, headers: dict[str, str], examples: int,
                   failures: list[str]) -> None:
    strategy = st.one_of(*(operation.as_strategy(generation_mode=mode) for mode in GenerationMode))
    targets = st.sampled_from(["generated", "own", "other"])

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy, target=targets)
    def check(case: Any, target: str) -> None:
        run.homes.ensure()
        aim(run, case, caller, target)
        try:
            send(run, case, headers)
        except Exception as failure:
            failures.append(f"{operation.label} as {caller}: {type(failure).__name__}: {failure}")

    check()


def aim(run: Run, case: Any, caller: str, target: str) -> None:
    """Points some generated requests at what exists: a tenant's sandbox, the template, the warm pool."""
    if target == "generated":
        return
    path = case.path_parameters or {}
    if "sandbox_id" in path:
        tenant = "bob" if (target == "own") == (caller == "tenant") else ADMIN
        path["sandbox_id"] = run.homes.ids[tenant]
    if "name" in path and case.method != "DELETE":
        path["name"] = "basic" if "templates" in case.path else "basic-pool"
    if case.operation.definition.raw.get("operationId") == "create_sandbox" and isinstance(case.body, dict):
        for source in ("template", "warmpool", "snapshot"):
            case.body.pop(source, None)
        case.body.update({"warmpool": "basic-pool"} if target == "own" else {"template": "basic"})


def send(run: Run, case: Any, headers: dict[str, str], content: bytes | None = None) -> None:
    """Sends the case (with `content` as its raw body, if given) and checks the answer and the server's log."""
    if content is None:
        response = case.call(base_url=run.server.url, session=run.session, headers=headers, timeout=REQUEST_TIMEOUT)
    else:
        response = run.http.request(case.method, _url(case), content=content,
                                    headers={**headers, "Content-Type": case.media_type or "application/json"})
    run.requests += 1
    request = (f"{case.method} {short(case.formatted_path)} query={short(repr(case.query))} "
               f"body={short(repr(content if content is not None else case.body))}")
    log = run.new_log()
    assert "Traceback" not in log, f"{request}\nleft in the server's log:\n{log[-3000:]}"
    try:
        case.validate_response(response, checks=CHECKS)
    except FailureGroup as failures:
        found = "; ".join(f"{failure.title}: {failure.message}" for failure in failures.exceptions)
        raise AssertionError(f"{request}\nanswered {response.status_code}: {response.text[:500]}\n{found}") from None
    tidy(run, case, response, headers)


def _url(case: Any) -> str:
    """The case's path and query, percent-encoded byte for byte (a lone surrogate goes out as its one byte)."""
    path = case.path.format(**{name: quote(value, safe="", errors="surrogateescape")
                               for name, value in case.path_parameters.items()})
    query = "&".join(f"{quote(name)}={quote(value, safe='', errors='surrogateescape')}"
                     for name, value in case.query.items())
    return f"{path}?{query}" if query else path


def short_failure(text: str) -> str:
    """The offending request (the first line) and how the server failed (the end of its log)."""
    return text if len(text) < 4000 else f"{text[:1000]}\n...\n{text[-3000:]}"


def short(text: str) -> str:
    return text if len(text) < 300 else f"{text[:150]}...({len(text)} characters)...{text[-100:]}"


def tidy(run: Run, case: Any, response: Any, headers: dict[str, str]) -> None:
    """Deletes what a successful call made, so that the run stays within the node's sandboxes."""
    if not 200 <= response.status_code < 300:
        return
    name = case.operation.definition.raw.get("operationId")
    if name == "create_sandbox":
        run.http.delete(f"/v1/sandboxes/{response.json()['id']}", headers=headers)
    elif name == "fork_sandbox":
        for sandbox in response.json():
            run.http.delete(f"/v1/sandboxes/{sandbox['id']}", headers=headers)
    elif name == "snapshot_sandbox":
        run.http.delete(f"/v1/snapshots/{response.json()['name']}", headers=headers)


# -- edges --------------------------------------------------------------------------------------

DEEP = 5000
EDGE_JSON = [
    "null", "true", "0", "-1", "-0", "0.5", "9223372036854775808", "18446744073709551616", "1" + "0" * 400,
    "-1" + "0" * 400, "1e308", "-1e308", "1e999", "-1e999", "5e-324", "NaN", "Infinity", "-Infinity",
    '""', '"\\u0000"', '"\\ud800"', '"\\udfff\\ud800"', json.dumps("é漢字🙂\u202e\ufeff"), '"NaN"', '"-1"',
    json.dumps("x" * 2_000_000), "[]", "[null]", '[""]', '["\\u0000"]', '["\\ud800"]', '["a", 1]',
    "[" * DEEP + "]" * DEEP, "{}", '{"": ""}', '{"\\u0000": "v"}', '{"A=B": "v"}', '{"K": "\\ud800"}',
    '{"K": "\\u0000"}', '{"K": {"K": "v"}}', '{"a": ' * DEEP + "null" + "}" * DEEP,
    json.dumps({f"K{i}": "v" for i in range(50_000)}),
]
"""JSON values at the edges of every type, as text (NaN, Infinity and 1e999 are not JSON, but parsers meet them)."""
EDGE_BODIES = [b"", b"null", b"[]", b"0", b'"x"', b"{", b"\xff\xfe{}", b"\xef\xbb\xbf{}", b"{}" + b" " * 3_000_000]
"""Whole JSON bodies at the edges: empty, not an object, truncated, not UTF-8, a BOM, padded to megabytes."""
EDGE_BYTES = [b"", b"\0" * 1024, bytes(range(256)) * 4096, b"ustar" + b"\xff" * 600]
"""Raw bodies at the edges: empty, zeros, a megabyte of every byte, a broken tar header."""
EDGE_TEXT = ["", "\0", "%00", "-1", "0", "99999999999999999999999", "1e400", "NaN", "-Infinity", "true", "..",
             "../../../etc/passwd", "/" * 4096, "a" * 20_000, "é漢字🙂", "\udcff", " ", "a/b", "%2e%2e"]
"""Query and path values at the edges (\\udcff goes out as a lone, invalid UTF-8 byte). The climb ends at
/etc/passwd, which the run removes and makes again as a directory: fork and snapshot must then refuse (409), not
fail (it kept runc from starting the sandbox again, a 503 that lost the sandbox)."""
VALID_BODIES = {"create_sandbox": {"warmpool": "basic-pool"}, "exec_command": {"command": "true"},
                "exec_stream": {"command": "true"}, "fork_sandbox": {"count": 1},
                "snapshot_sandbox": {"name": "edge"}, "apply": {"documents": []}}
VALID_QUERY = {"path": "/tmp/edge", "mode": "420", "recursive": "false", "ids": "a,b", "offset": "0", "memory": "true",
               "metadata": "", "image": "docker://127.0.0.1:9/edge:1", "warm_only": "false", "retry": "false",
               "request_key": "edge-key"}


def edges(run: Run, operation: Any) -> Iterator[tuple[Any, bytes]]:
    """(case, raw body) pairs: the operation with one value at a time at an edge, the others valid."""
    definition = operation.definition.raw
    names = [(p["name"], p["in"]) for p in definition.get("parameters", [])]
    path = {name: run.homes.ids[ADMIN] if name == "sandbox_id" else "basic"
            for name, where in names if where == "path"}
    query = {name: VALID_QUERY[name] for name, where in names if where == "query"}
    media = next(iter(definition.get("requestBody", {}).get("content", {})), None)
    body = VALID_BODIES.get(definition.get("operationId"), {})
    valid = json.dumps(body).encode() if media == "application/json" else b"" if media is None else b"edge"

    def case(path_parameters: dict[str, Any] = path, query: dict[str, Any] = query) -> Any:
        return operation.Case(path_parameters=dict(path_parameters), query=dict(query), media_type=media)

    for name in path:
        for value in (value for value in EDGE_TEXT if value and "/" not in value and value not in (".", "..")):
            # the others reach other routes (a client removes dot segments: `processes/..` is the sandbox)
            yield case(path_parameters={**path, name: value}), valid
    for name in query:
        for value in EDGE_TEXT:
            yield case(query={**query, name: value}), valid
    if media == "application/octet-stream":
        for content in EDGE_BYTES:
            yield case(), content
    elif media == "application/json":
        for content in EDGE_BODIES:
            yield case(), content
        properties = run.schema.raw_schema["components"]["schemas"][_ref_name(definition)]["properties"]
        for field_name in properties:
            for value in EDGE_JSON:
                fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in body.items() if k != field_name]
                yield case(), ("{" + ", ".join([*fields, f"{json.dumps(field_name)}: {value}"]) + "}").encode()


def _ref_name(definition: dict[str, Any]) -> str:
    return definition["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
