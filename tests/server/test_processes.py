"""Background processes, terminals and shell sessions through a real server and the SDK (docs/processes.md)."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Iterator

import httpx
import pytest

from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.client.sync import Sandbox
from rollbox.errors import InvalidRequest, ProcessNotFound, SandboxNotFound
from rollbox.models import ExecResult
from tests.support.servers import ADMINS, TEMPLATE, TOKENS, router


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with router(tmp_path_factory.mktemp("processes"), TOKENS, ADMINS) as address:
        with SandboxClient(address, token=TOKENS["alice"]) as client:
            client.apply(TEMPLATE)
        yield address


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[SandboxClient]:
    with SandboxClient(url, token=TOKENS["alice"]) as alice:
        yield alice


@pytest.fixture
def sandbox(client: SandboxClient) -> Iterator[Sandbox]:
    with client.create_sandbox(template="basic") as box:
        yield box


def test_background_process_lives_between_calls_with_stdin_and_replay(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("echo started; cat; echo done >&2", background=True)
    assert handle.info.running and handle.pid > 1
    assert sandbox.run("true").ok  # other calls meanwhile
    assert [p.id for p in sandbox.commands.list()] == [handle.id]
    handle.send_stdin("one\n")
    again = sandbox.commands.connect(handle.id)  # as after a reconnect
    again.send_stdin("two\n")
    again.close_stdin()
    result = handle.wait()
    assert (result.exit_code, result.stdout, result.stderr) == (0, "started\none\ntwo\n", "done\n")
    replay = [(e.type, e.data, e.offset) for e in again.events(offset=8) if e.type != "end"]
    assert replay[0] == ("start", "", 8)  # "started\n" skipped
    assert "".join(data for kind, data, _ in replay if kind == "stdout") == "one\ntwo\n"
    assert replay[-1][2] == len("started\none\ntwo\ndone\n")
    info = handle.refresh()
    assert (info.running, info.exit_code) == (False, 0)


def test_signals_and_delete(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("trap 'echo term; exit 3' TERM; echo trapped; while true; do sleep 0.05; done",
                                  background=True)
    events = handle.events(0)
    assert next(event for event in events if event.type == "stdout").data == "trapped\n"
    events.close()
    handle.kill("SIGTERM")
    result = handle.wait()
    assert (result.exit_code, result.stdout) == (3, "trapped\nterm\n")
    sleeper = sandbox.commands.run(["sleep", "100"], background=True, tag="sleeper")
    sandbox.commands.kill(sleeper.id)  # SIGKILL
    assert sleeper.wait().signal == 9
    sleeper.delete()
    with pytest.raises(ProcessNotFound):
        sleeper.refresh()
    assert [p.id for p in sandbox.commands.list()] == [handle.id]


def test_processes_die_with_reset_and_delete(client: SandboxClient) -> None:
    box = client.create_sandbox(template="basic")
    handle = box.commands.run("sleep 100", background=True)
    box.reset()
    assert box.commands.list() == []
    with pytest.raises(ProcessNotFound):
        box.commands.connect(handle.id)
    handle = box.commands.run("sleep 100", background=True)
    box.delete()
    with pytest.raises(SandboxNotFound):
        handle.refresh()


def test_timeout_and_output_limit(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("echo before; sleep 100", background=True, timeout=0.3)
    result = handle.wait()
    assert result.timed_out and result.exit_code is None and result.stdout == "before\n"
    flood = sandbox.commands.run("head -c 5000000 /dev/zero | tr '\\0' x; echo; echo tail", background=True,
                                 output_limit=65536)
    while flood.refresh().running:
        time.sleep(0.05)
    result = flood.wait()  # what is kept: the last 64 KiB
    assert result.stdout_truncated and result.stdout.endswith("x\ntail\n") and len(result.stdout) <= 65536


def test_pty_echo_and_resize(sandbox: Sandbox) -> None:
    term = sandbox.commands.run(["/bin/sh"], background=True, pty=(30, 100), env={"PS1": "$ "})
    events = term.events(0)
    seen = ""

    def read_until(text: str) -> None:
        nonlocal seen
        while text not in seen:
            seen += next(events).data

    term.send_stdin("stty size\n")
    read_until("30 100")
    assert "stty size" in seen  # the terminal echoed the keystrokes
    term.resize(40, 120)
    term.send_stdin("stty size; exit 4\n")
    read_until("40 120")
    events.close()
    assert term.wait().exit_code == 4 and term.info.pty


def test_shell_session_keeps_state_and_survives_a_timeout(sandbox: Sandbox) -> None:
    with sandbox.shell() as shell:
        assert shell.run("cd /tmp && export GREETING=hi && f() { echo \"f:$1\"; }").ok
        result = shell.run("pwd; echo $GREETING; f x; echo err >&2; false")
        assert (result.exit_code, result.stdout, result.stderr) == (1, "/tmp\nhi\nf:x\n", "err\n")
        started = time.monotonic()
        result = shell.run("echo partial; sleep 100", timeout=0.5)
        assert result.timed_out and result.stdout == "partial\n" and time.monotonic() - started < 5
        assert shell.run("pwd; echo $GREETING").stdout == "/tmp\nhi\n"
        assert shell.run("if then").exit_code == 2  # a syntax error fails the command, not the session
        assert shell.run("cat").stdout == ""  # stdin is not the session's
        assert any(p.shell for p in sandbox.commands.list())
    assert not any(p.shell for p in sandbox.commands.list())


def test_another_tenant_sees_nothing(url: str, sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 100", background=True)
    with SandboxClient(url, token=TOKENS["bob"]) as other:
        base = f"/v1/sandboxes/{sandbox.id}/processes"
        for method, path, body in [("GET", base, None), ("GET", f"{base}/{handle.id}", None),
                                   ("GET", f"{base}/{handle.id}/events", None),
                                   ("POST", f"{base}/{handle.id}/control", {"signal": 9}),
                                   ("DELETE", f"{base}/{handle.id}", None),
                                   ("POST", base, {"command": "true"}),
                                   ("POST", f"/v1/sandboxes/{sandbox.id}/shells", {})]:
            answer = _raw(other, method, path, body)
            assert answer.status_code == 404, (method, path, answer.text)
    assert handle.refresh().running


def _raw(client: SandboxClient, method: str, path: str, body: object) -> httpx.Response:
    """One request as sent by hand, bypassing the SDK's checks."""
    content = None if body is None else json.dumps(body)
    path, _, query = path.partition("?")
    request = client._settings.request(method, path, content=content, headers={"content-type": "application/json"},
                                       params=dict(part.split("=") for part in query.split("&")) if query else None)
    return client._http.send(request)


def test_bad_input_answers_4xx(client: SandboxClient, sandbox: Sandbox) -> None:
    base = f"/v1/sandboxes/{sandbox.id}/processes"
    handle = sandbox.commands.run("sleep 100", background=True)
    cases = [("POST", base, {"command": []}), ("POST", base, {"command": "true", "pty": {"rows": 0}}),
             ("POST", base, {"command": "true", "bogus": 1}), ("POST", base, {"command": "true", "timeout": -1}),
             ("POST", f"{base}/{handle.id}/control", {"signal": "SIGBOGUS"}),
             ("POST", f"{base}/{handle.id}/control", {"signal": 99}),
             ("GET", f"{base}/{handle.id}/events?offset=-3", None), ("GET", f"{base}/nope/events", None),
             ("GET", f"{base}/no%20such", None), ("POST", f"{base}/nope/control", {"stdin": "x"}),
             ("DELETE", f"{base}/{'x' * 300}", None),
             ("POST", f"/v1/sandboxes/{sandbox.id}/shells/nope/run", {"command": "true"})]
    for method, target, body in cases:
        answer = _raw(client, method, target, body)
        assert 400 <= answer.status_code < 500, (method, target, answer.status_code, answer.text)
    with pytest.raises(InvalidRequest):
        sandbox.commands.run("true", background=True, pty=(0, 0))
    assert handle.refresh().running


def test_a_stalled_reader_blocks_neither_the_process_nor_the_server(sandbox: Sandbox) -> None:
    flood = sandbox.commands.run("head -c 300000000 /dev/zero; echo end", background=True)
    events = flood.events(0)
    next(events)  # the stream is open and then never read again
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    deadline = time.monotonic() + 60
    while flood.refresh().running:
        assert time.monotonic() < deadline, "the flood blocked on a reader that stopped reading"
        time.sleep(0.1)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 64, f"the server's memory grew by {grown_mb:.0f} MB for one stalled reader"
    events.close()
    assert flood.wait().stdout.endswith("end\n")


def test_hundred_concurrent_background_processes_async(url: str, sandbox: Sandbox) -> None:
    """Each process counts its lines with the shell's builtins: a hundred shells and their supervisors fit the
    template's 256 pids, where a `$(seq ...)` each (a fork more apiece) would not, and its fork would fail."""
    lines = 200
    count = f"i=0; while [ $i -lt {lines} ]; do i=$((i + 1)); echo {{n}}:$i; done"

    async def main() -> list[ExecResult]:
        async with AsyncSandboxClient(url, token=TOKENS["alice"]) as client:
            box = await client.get_sandbox(sandbox.id)
            handles = await asyncio.gather(*(box.commands.run(count.format(n=n), background=True)
                                             for n in range(100)))
            results = await asyncio.gather(*(handle.wait() for handle in handles))
            assert len(await box.commands.list()) >= 64
            return results

    for n, result in enumerate(asyncio.run(main())):
        assert result.exit_code == 0, (n, result.stderr)
        assert result.stdout.split() == [f"{n}:{i}" for i in range(1, lines + 1)], f"process {n} lost output"


def test_pids_limit_counts_background_processes(client: SandboxClient, sandbox: Sandbox) -> None:
    handles = [sandbox.commands.run("sleep 100", background=True) for _ in range(5)]
    assert sandbox.stats().pids >= 10  # each process and its supervisor
    for handle in handles:
        handle.delete()
    assert sandbox.commands.list() == []


def test_agent_survives_its_clients_going_away(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("for i in $(seq 50); do echo $i; sleep 0.01; done", background=True)
    for _ in range(5):
        events = handle.events(0)
        next(events)
        events.close()  # hang up mid-stream
    assert handle.wait().stdout.split() == [str(i) for i in range(1, 51)]

