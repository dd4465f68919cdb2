"""E2B's SDK, unmodified, against a real `rollbox serve`: the calls as a user writes them, sync and async.

One server and one warm pool serve the module; the SDK finds them through its own settings (E2B_API_URL,
E2B_SANDBOX_URL, E2B_API_KEY), with a rollbox token as the API key.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FilesystemEventType,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxState,
    TimeoutException,
)

from rollbox.client import SandboxClient
from tests.support.cluster import wait_for
from tests.support.e2b import e2b_server
from tests.support.servers import TEMPLATE, TOKENS

POOL = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {name: e2b-pool}
spec:
  sandboxTemplateRef: {name: basic}
  replicas: 2
"""


@pytest.fixture(scope="module", autouse=True)
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `rollbox serve` on a loopback port with two tenants, `basic` and a warm pool of it; the SDK's settings
    point at it for the module."""
    with e2b_server(tmp_path_factory.mktemp("e2b")) as url:
        with SandboxClient(url, token=TOKENS["alice"]) as client:
            client.apply(TEMPLATE + "---\n" + POOL)
            wait_for(lambda: client.get_warmpool("e2b-pool").ready == 2, "the warm pool fills")
        yield url


def test_a_sandbox_from_a_warm_pool_runs_commands_and_files_until_killed() -> None:
    sandbox = Sandbox.create(template="e2b-pool", timeout=120, envs={"GREETING": "hello"}, metadata={"run": "7"})
    seen: list[str] = []
    result = sandbox.commands.run("echo $GREETING $EXTRA; echo oops >&2; pwd", envs={"EXTRA": "there"}, cwd="/tmp",
                                  on_stdout=seen.append, on_stderr=seen.append)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello there\n/tmp\n", "oops\n")
    assert "".join(seen).count("oops") == 1 and "hello there" in "".join(seen)

    watcher = sandbox.files.watch_dir("/tmp", recursive=True)
    sandbox.files.write("/tmp/work/notes.txt", "first\n")
    sandbox.files.write_files([{"path": "/tmp/work/a.bin", "data": b"\x00\x01"},
                               {"path": "/tmp/work/b.txt", "data": "b"}])
    assert sandbox.files.read("/tmp/work/notes.txt") == "first\n"
    assert sandbox.files.read("/tmp/work/a.bin", format="bytes") == b"\x00\x01"
    assert sorted(entry.name for entry in sandbox.files.list("/tmp/work")) == ["a.bin", "b.txt", "notes.txt"]
    assert sandbox.files.exists("/tmp/work/b.txt") and not sandbox.files.exists("/tmp/work/none")
    assert sandbox.files.make_dir("/tmp/work/sub") and not sandbox.files.make_dir("/tmp/work/sub")
    assert sandbox.files.rename("/tmp/work/b.txt", "/tmp/work/sub/c.txt").path == "/tmp/work/sub/c.txt"
    assert sandbox.commands.run("cat /tmp/work/sub/c.txt").stdout == "b"
    assert ("work/sub/c.txt", FilesystemEventType.CREATE) in {(e.name, e.type) for e in watcher.get_new_events()}
    sandbox.files.remove("/tmp/work")
    assert not sandbox.files.exists("/tmp/work")
    assert ("work", FilesystemEventType.REMOVE) in {(e.name, e.type) for e in watcher.get_new_events()}
    watcher.stop()
    assert sandbox.commands.run("cat /opt/data/file").stdout == "baseline\n"  # the template's files

    info = sandbox.get_info()
    assert (info.sandbox_id, info.template_id, info.metadata, info.state) == (
        sandbox.sandbox_id, "e2b-pool", {"run": "7"}, SandboxState.RUNNING)
    assert sandbox.sandbox_id in [found.sandbox_id for found in Sandbox.list().next_items()]
    assert sandbox.is_running()

    assert sandbox.kill()
    assert sandbox.sandbox_id not in [found.sandbox_id for found in Sandbox.list().next_items()]
    with pytest.raises(SandboxNotRunningException):
        sandbox.commands.run("true")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info()
    assert not sandbox.is_running()


def test_a_template_without_a_pool_starts_cold() -> None:
    with Sandbox.create(template="basic") as sandbox:
        assert sandbox.commands.run("cat /opt/data/file").stdout == "baseline\n"
        assert sandbox.get_info().template_id == "basic"


def test_errors_come_in_the_sdks_exceptions() -> None:
    with pytest.raises(SandboxException) as unknown:
        Sandbox.create(template="no-such-template")
    assert unknown.value.status_code == 404
    with pytest.raises(AuthenticationException):
        Sandbox.create(template="e2b-pool", api_key="not-a-token")

    with Sandbox.create(template="e2b-pool") as sandbox:
        with pytest.raises(CommandExitException) as failed:
            sandbox.commands.run("echo partial; echo broken >&2; exit 3")
        assert (failed.value.exit_code, failed.value.stdout, failed.value.stderr) == (3, "partial\n", "broken\n")
        with pytest.raises(TimeoutException):
            sandbox.commands.run("sleep 30", timeout=1)
        assert sandbox.commands.run("echo still here").stdout == "still here\n"

        # another tenant's sandbox is not there for bob
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sandbox.sandbox_id, api_key=TOKENS["bob"])
        assert sandbox.sandbox_id not in [s.sandbox_id for s in Sandbox.list(api_key=TOKENS["bob"]).next_items()]
        assert not Sandbox.kill(sandbox.sandbox_id, api_key=TOKENS["bob"])
        assert sandbox.commands.run("true").exit_code == 0


def test_the_daemon_opens_a_sandbox_only_with_its_own_access_token() -> None:
    with Sandbox.create(template="e2b-pool") as mine, \
            Sandbox.create(template="e2b-pool", api_key=TOKENS["bob"]) as theirs:
        url = os.environ["E2B_SANDBOX_URL"]
        headers = {"E2b-Sandbox-Id": theirs.sandbox_id, "X-Access-Token": mine._envd_access_token or ""}
        answer = httpx.get(f"{url}/files", params={"path": "/opt/data/file"}, headers=headers)
        assert answer.status_code == 502 and "was not found" in answer.json()["message"]
        assert httpx.get(f"{url}/health", headers=headers).status_code == 502
        forged = {**headers, "X-Access-Token": f"bob:{'0' * 64}"}
        assert httpx.get(f"{url}/health", headers=forged).status_code == 502
        assert theirs.files.read("/opt/data/file") == "baseline\n"


def test_background_commands_have_handles() -> None:
    with Sandbox.create(template="e2b-pool") as sandbox:
        echo = sandbox.commands.run("cat", background=True, stdin=True)
        assert echo.pid in [process.pid for process in sandbox.commands.list()]
        sandbox.commands.send_stdin(echo.pid, "line one\n")
        echo.send_stdin("line two\n")
        echo.close_stdin()
        assert echo.wait().stdout == "line one\nline two\n"

        sleeper = sandbox.commands.run("sleep 100", background=True)
        assert sleeper.kill()
        with pytest.raises(CommandExitException):
            sleeper.wait()
        assert not sandbox.commands.kill(sleeper.pid)  # gone

        lines = sandbox.commands.run("cat", background=True, stdin=True)
        sandbox.commands.stream_input(lines.pid, [b"a\n", "b\n"])
        lines.close_stdin()
        assert lines.wait().stdout == "a\nb\n"

        screen: list[bytes] = []
        terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
        sandbox.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
        sandbox.pty.send_stdin(terminal.pid, b"echo pty-$((6*7)); stty size; exit\n")
        terminal.wait(on_pty=screen.append)
        assert "pty-42" in b"".join(screen).decode() and "30 100" in b"".join(screen).decode()

        ticks = sandbox.commands.run("for i in 1 2 3; do echo $i; sleep 0.3; done", background=True)
        ticks.disconnect()
        assert sandbox.commands.connect(ticks.pid).wait().stdout.split()[-1] == "3"

        arrivals: list[float] = []
        started = time.monotonic()
        sandbox.commands.run("echo first; sleep 1; echo second",
                             on_stdout=lambda _: arrivals.append(time.monotonic() - started))
        assert len(arrivals) == 2 and arrivals[0] < 0.8 and arrivals[1] >= 1  # streamed as it came


def test_pause_connect_and_fork() -> None:
    sandbox = Sandbox.create(template="e2b-pool")
    try:
        sandbox.files.write("/tmp/state", "kept")
        assert sandbox.pause()
        assert sandbox.get_info().state == SandboxState.PAUSED
        assert not sandbox.pause()  # already paused
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert resumed.get_info().state == SandboxState.RUNNING
        assert resumed.commands.run("cat /tmp/state").stdout == "kept"

        snapshot = sandbox.create_snapshot()
        assert snapshot.snapshot_id in [found.snapshot_id for found in Sandbox.list_snapshots().next_items()]
        with Sandbox.create(template=snapshot.snapshot_id) as started:
            assert started.commands.run("cat /tmp/state").stdout == "kept"
        assert Sandbox.delete_snapshot(snapshot.snapshot_id)

        children = sandbox.fork(count=2)
        assert len(children) == 2
        for child in children:
            assert isinstance(child, Sandbox) and child.sandbox_id != sandbox.sandbox_id
            assert child.commands.run("cat /tmp/state").stdout == "kept"
            child.kill()
    finally:
        sandbox.kill()


@pytest.mark.anyio
async def test_async_sandbox() -> None:
    sandbox = await AsyncSandbox.create(template="e2b-pool", envs={"WHO": "async"})
    try:
        seen: list[str] = []
        result = await sandbox.commands.run("echo $WHO", on_stdout=seen.append)
        assert result.stdout == "async\n" and "".join(seen) == "async\n"
        events: list[str] = []
        watcher = await sandbox.files.watch_dir("/tmp", on_event=lambda event: events.append(event.name))
        await sandbox.files.write("/tmp/async/a.txt", "data")
        assert await sandbox.files.read("/tmp/async/a.txt") == "data"
        assert [entry.name for entry in await sandbox.files.list("/tmp/async")] == ["a.txt"]
        for _ in range(40):
            if events:
                break
            await anyio.sleep(0.05)
        await watcher.stop()
        assert events == ["async"]
        with pytest.raises(CommandExitException):
            await sandbox.commands.run("exit 1")
        handle = await sandbox.commands.run("read line; echo got $line", background=True, stdin=True)
        await handle.send_stdin("it\n")
        assert (await handle.wait()).stdout == "got it\n"
        assert (await sandbox.get_info()).sandbox_id == sandbox.sandbox_id
    finally:
        await sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.connect(sandbox.sandbox_id)


def test_set_timeout_moves_the_end() -> None:
    sandbox = Sandbox.create(template="e2b-pool", timeout=600)
    sandbox.set_timeout(2)
    left = sandbox.get_info().end_at.timestamp() - time.time()
    assert 0 < left <= 2.5
    wait_for(lambda: sandbox.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()],
             "the sandbox ends at its new timeout", timeout=15)
    with pytest.raises(SandboxNotFoundException):
        sandbox.set_timeout(10)
