"""Traces across the process boundary: one RL episode's spans in the trainer (kept in memory) and the server's
(exported by OTLP from the embedded server's process, where router and node run, to a collector stand-in) form
one tree."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollbox.client import AsyncSandboxClient
from rollbox.rl.collect import Observation, collect_async
from tests.support.servers import example_tasks, rl_server
from tests.support.tracing import Receiver, Span, exporting_to, local, traced_here

pytestmark = pytest.mark.anyio
TASK = next(task for task in example_tasks() if task.id == "ledger-format-cents")
EXEC = "POST /v1/sandboxes/{sandbox_id}/exec"
STREAM = EXEC + "/stream"


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, collector: Receiver) -> Iterator[str]:
    """An embedded server (its own process) that exports its spans to `collector`."""
    with contextlib.ExitStack() as stack:
        with exporting_to(collector, OTEL_SERVICE_NAME="rollbox-server"):
            address = stack.enter_context(rl_server(tmp_path_factory.mktemp("traced")))
        yield address


async def fix_and_submit(observation: Observation) -> Any:
    """Looks, fixes with the reference edit, submits: one exec, file calls, and the verification's exec."""
    edits = [{"tool": "str_replace", "path": e.path, "old": e.old, "new": e.new} for e in TASK.solution or []]
    script = [{"tool": "bash", "command": "ls"}, *edits, {"tool": "submit"}]
    return script[observation.step]


def children(spans: list[Span], parent: Span, name: str) -> list[Span]:
    return [span for span in spans if span.parent_id == parent.span_id and span.name == name]


def only(spans: list[Span], parent: Span, name: str) -> Span:
    found = children(spans, parent, name)
    assert len(found) == 1, f"{name} under {parent.name}: {found}"
    return found[0]


async def test_one_episode_is_one_tree_from_the_trainer_to_the_node(url: str, collector: Receiver) -> None:
    with traced_here() as memory:
        async with AsyncSandboxClient(url) as client:
            [trajectory] = await collect_async(fix_and_submit, [TASK], client=client, group_size=1, progress=False)
        mine = [local(span) for span in memory.get_finished_spans()]
    assert trajectory.reward == 1.0 and trajectory.error is None
    [episode] = [span for span in mine if span.name == "rollbox.rl.episode"]
    steps = children(mine, episode, "rollbox.rl.step")
    assert [step.attributes["rollbox.rl.tool"] for step in steps] == ["bash", *["str_replace"] * (len(steps) - 2),
                                                                      "submit"]
    exec_call = only(mine, steps[0], "rollbox.exec")
    assert exec_call.attributes["rollbox.sandbox.id"] == episode.attributes["rollbox.sandbox.id"]
    verify = only(mine, steps[-1], "rollbox.rl.verify")
    assert verify.attributes["rollbox.rl.reward"] == 1.0
    assert children(mine, steps[1], "rollbox.files"), "an edit reads and writes the file"

    theirs = collector.wait_for(EXEC, 2)
    assert {span.service for span in theirs} == {"rollbox-server"}
    spans = mine + collector.spans
    served = only(spans, exec_call, EXEC)
    assert served.trace_id == episode.trace_id and served.service == "rollbox-server"
    assert served.attributes["rollbox.sandbox.id"] == exec_call.attributes["rollbox.sandbox.id"]
    phases = [served.attributes[f"rollbox.exec.{phase}_ms"] for phase in ("queue", "agent", "command")]
    assert all(ms >= 0 for ms in phases) and phases[2] > 0, phases
    assert served.attributes["http.response.status_code"] == 200
    only(spans, only(mine, verify, "rollbox.exec"), EXEC)

    [group] = [span for span in mine if span.name == "rollbox.rl.group"]
    assert episode.parent_id == group.span_id
    claim = only(mine, group, "rollbox.claim")
    assert only(spans, claim, "POST /v1/sandboxes").attributes["rollbox.operation"] == "create_sandbox"


def test_a_malformed_traceparent_is_ignored(url: str, collector: Receiver) -> None:
    socket = url.removeprefix("unix://")
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://rollbox") as http:
        for header in ("00-zz-yy-01", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "x" * 10_000):
            answer = http.get("/v1/sandboxes", headers={"traceparent": header})
            assert answer.status_code == 200, (header[:40], answer.text)
    listed = collector.wait_for("GET /v1/sandboxes", 4)
    assert len({span.trace_id for span in listed}) == len(listed), "each started a trace of its own"


async def test_tracing_off_sends_no_trace_context(url: str, collector: Receiver) -> None:
    seen: list[httpx.Headers] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json=[])

    from rollbox.client import SandboxClient

    with SandboxClient("http://rollbox", transport=httpx.MockTransport(record)) as client:
        client.list_sandboxes()
        with traced_here():
            client.list_sandboxes()
    assert "traceparent" not in seen[0] and "traceparent" in seen[1]



async def test_a_streamed_commands_span_lasts_until_its_stream_ends(url: str, collector: Receiver) -> None:
    lines: list[str] = []
    with traced_here() as memory:
        async with AsyncSandboxClient(url) as client, await client.create_sandbox(template=TASK.template) as sandbox:
            result = await sandbox.commands.run("echo one; sleep 0.3; echo two", on_stdout=lines.append)
        mine = [local(span) for span in memory.get_finished_spans()]
    assert result.exit_code == 0 and "".join(lines) == "one\ntwo\n"
    [call] = [span for span in mine if span.name == "rollbox.exec"]
    collector.wait_for(STREAM)
    served = only(mine + collector.spans, call, STREAM)
    assert served.duration_ms >= 300
    # the node's split of it, made as the stream ended: the agent's part ends when the host read that the command
    # started, which on a busy machine can come after the command's first moments
    assert served.attributes["rollbox.exec.agent_ms"] + served.attributes["rollbox.exec.command_ms"] >= 300
