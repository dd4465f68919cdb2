"""Tracing's switches and names: off unless asked, nothing of OpenTelemetry loaded when off, the standard
variables honoured, and every API call's span named for its operation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rollbox import tracing
from rollbox.client._traced import describe
from rollbox.server.tracing import traced_endpoint

CLEAN = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
LOADS = """\
import sys
import rollbox.cli, rollbox.cli.serve, rollbox.client, rollbox.rl.collect, rollbox.rl.train, rollbox.server.app
import rollbox.cluster.remote, rollbox.node.local
from rollbox import tracing
print(tracing.on, sorted({m.split('.')[0] for m in sys.modules if m.startswith('opentelemetry')}))
"""


def python(code: str, **environ: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**CLEAN, **environ},
                          check=True)
    return done.stdout


def test_off_by_default_and_nothing_of_opentelemetry_loaded() -> None:
    assert python(LOADS).split("\n")[0] == "False []"
    assert python(LOADS, OTEL_TRACES_EXPORTER="none").split("\n")[0] == "False []"


def test_the_standard_variables_turn_it_on_or_keep_it_off() -> None:
    code = ("from rollbox import tracing\nwith tracing.span('hello', {'a': 1}): pass\nprint(tracing.on)\n"
            "if tracing.on:\n    from opentelemetry import trace\n    trace.get_tracer_provider().shutdown()")
    printed = python(code, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="trainer")
    span = json.loads(printed[printed.index("{"):printed.rindex("}") + 1])
    assert printed.startswith("True") and span["name"] == "hello" and span["attributes"] == {"a": 1}
    assert span["resource"]["attributes"]["service.name"] == "trainer"
    assert python(code, OTEL_TRACES_EXPORTER="console", OTEL_SDK_DISABLED="true").strip() == "False"


@pytest.mark.parametrize(("variables", "exporters"), [
    ({}, []), ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]), ({"OTEL_TRACES_EXPORTER": "otlp, console"},
                                                            ["otlp", "console"]),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, []), ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "TRUE"}, []),
])
def test_which_exporters_the_environment_asks_for(variables: dict[str, str], exporters: list[str]) -> None:
    assert tracing.from_environment(variables) == exporters


def test_an_unknown_exporter_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown trace exporter 'zipkin'"):
        tracing.enable("zipkin")
    assert not tracing.on


@pytest.mark.parametrize(("method", "path", "name"), [
    ("POST", "/v1/sandboxes", "rollbox.claim"), ("GET", "/v1/sandboxes", "rollbox.list"),
    ("POST", "/v1/sandboxes/n1-ab/exec", "rollbox.exec"), ("POST", "/v1/sandboxes/n1-ab/exec/stream", "rollbox.exec"),
    ("PUT", "/v1/sandboxes/n1-ab/files", "rollbox.files"),
    ("GET", "/v1/sandboxes/n1-ab/files/archive", "rollbox.files"),
    ("POST", "/v1/sandboxes/n1-ab/fork", "rollbox.fork"), ("POST", "/v1/sandboxes/n1-ab/snapshot", "rollbox.snapshot"),
    ("POST", "/v1/sandboxes/n1-ab/reset", "rollbox.reset"), ("DELETE", "/v1/sandboxes/n1-ab", "rollbox.delete"),
    ("GET", "/v1/sandboxes/n1-ab", "rollbox.get"), ("GET", "/healthz", "rollbox GET /healthz"),
])
def test_each_call_is_named_for_its_operation(method: str, path: str, name: str) -> None:
    found, attributes = describe(method, path)
    assert found == name and attributes["url.path"] == path
    assert attributes.get("rollbox.sandbox.id") == ("n1-ab" if "/n1-ab" in path else None)


def test_a_server_without_tracing_runs_its_own_code_unwrapped() -> None:
    async def endpoint(*_: object) -> None: ...

    assert not tracing.on
    assert traced_endpoint("GET", "/x", "endpoint", endpoint) is endpoint  # type: ignore[type-var]
