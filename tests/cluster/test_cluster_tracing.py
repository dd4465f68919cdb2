"""Traces through a cluster: the trainer's span is the parent of the router's, whose span is the parent of the node
agent's, each a process of its own exporting by OTLP to a collector stand-in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox import tracing
from rollbox.client import SandboxClient
from tests.support.cluster import ADMINS, TOKENS, Cluster, running_cluster
from tests.support.servers import TEMPLATE
from tests.support.tracing import Receiver, Span, exporting_to, local, traced_here


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, collector: Receiver) -> Iterator[Cluster]:
    with contextlib.ExitStack() as stack:
        with exporting_to(collector):
            cluster = stack.enter_context(running_cluster(Path(tmp_path_factory.mktemp("traced")), {"alpha": 4},
                                                          tokens=TOKENS, admins=ADMINS))
        yield cluster


def child(spans: list[Span], parent: Span, name: str) -> Span:
    found = [span for span in spans if span.parent_id == parent.span_id and span.name == name]
    assert len(found) == 1, f"{name} under {parent.name} ({parent.span_id}): {spans}"
    return found[0]


def test_a_trainers_span_is_the_parent_of_the_routers_and_the_nodes(cluster: Cluster, collector: Receiver) -> None:
    with SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
        client.apply(TEMPLATE)
        with traced_here() as memory:
            with tracing.span("trainer.step"), client.create_sandbox(template="basic") as sandbox:
                assert sandbox.commands.run("echo hi").stdout == "hi\n"
            mine = [local(span) for span in memory.get_finished_spans()]
    [step] = [span for span in mine if span.name == "trainer.step"]
    execute = child(mine, step, "rollbox.exec")
    name = "POST /v1/sandboxes/{sandbox_id}/exec"
    collector.wait_for(name, 2)
    spans = mine + collector.spans
    routed = child(spans, execute, name)
    served = child(spans, routed, name)
    assert routed.trace_id == served.trace_id == step.trace_id
    assert "rollbox.exec.command_ms" in served.attributes and "rollbox.exec.command_ms" not in routed.attributes
    claimed = child(spans, child(spans, child(mine, step, "rollbox.claim"), "POST /v1/sandboxes"),
                    "POST /v1/sandboxes")
    assert claimed.attributes["http.response.status_code"] == 201
