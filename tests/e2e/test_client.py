"""The SDK against a real router on a unix socket, over a real node and engine. (The SDK on its own is in the unit
tier.)"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from rollbox import errors
from rollbox.client import AsyncSandboxClient, SandboxClient
from tests.support.servers import TEMPLATE


def test_apply_streams_progress_then_tells_what_changed(client: SandboxClient) -> None:
    document = TEMPLATE.replace("name: basic", "name: progress").replace("echo baseline", "echo other")
    events: list[str] = []
    applied = client.apply(document, on_progress=lambda event: events.append(event.event))
    assert [(e.kind, e.name, e.status) for e in applied] == [("SandboxTemplate", "progress", "created")]
    assert events[0] == "progress" and events[-1] == "applied"
    assert client.apply(document)[0].status == "unchanged"
    assert {"basic", "progress"} <= {template.name for template in client.list_templates()}
    assert "echo other" in client.get_template("progress").spec["steps"][0]["run"]
    client.delete_template("progress")
    with pytest.raises(errors.TemplateNotFound):
        client.get_template("progress")


def test_only_an_admin_changes_templates_and_pools(url: str, client: SandboxClient) -> None:
    with SandboxClient(url, token="bob-token") as bob:
        with pytest.raises(errors.Forbidden, match="admin"):
            bob.apply(TEMPLATE.replace("echo baseline", "echo planted"))
        with pytest.raises(errors.Forbidden):
            bob.delete_template("basic")
        assert "echo baseline" in bob.get_template("basic").spec["steps"][0]["run"]


def test_apply_reads_files_and_raises_a_failed_build(client: SandboxClient, tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(TEMPLATE.replace("name: basic", "name: broken").replace("mkdir", "exit 7; mkdir"))
    with pytest.raises(errors.BuildFailed, match="broken"):
        client.apply(path)
    with pytest.raises(errors.TemplateNotFound):
        client.create_sandbox(template="broken")


def test_warm_pools_fill_hand_out_sandboxes_and_go(client: SandboxClient) -> None:
    pool = ("kind: SandboxWarmPool\nmetadata: {name: basic-pool}\n"
            "spec: {replicas: 1, sandboxTemplateRef: {name: basic}}\n")
    assert client.apply(pool)[0].status == "created"
    deadline = time.monotonic() + 60
    while client.get_warmpool("basic-pool").ready < 1:
        assert time.monotonic() < deadline, "the pool never filled"
        time.sleep(0.1)
    assert [(p.name, p.template, p.replicas) for p in client.list_warmpools()] == [("basic-pool", "basic", 1)]
    health = client.health()
    assert health.max_sandboxes == 32 and health.pools["basic-pool"]["ready"] == 1
    with client.create_sandbox(warmpool="basic-pool") as sandbox:
        assert (sandbox.info.warmpool, sandbox.info.template) == ("basic-pool", "basic")
        assert sandbox.run("cat /opt/data/file").stdout == "baseline\n"
    client.delete_warmpool("basic-pool")
    with pytest.raises(errors.NotFound):
        client.get_warmpool("basic-pool")


def test_claim_run_and_delete(client: SandboxClient) -> None:
    sandbox = client.create_sandbox(template="basic", env={"GREETING": "hi"}, labels={"episode": "7"},
                                    shutdown_after="10m")
    info = sandbox.info
    assert (info.template, info.state, info.tenant, info.labels) == ("basic", "running", "alice", {"episode": "7"})
    assert info.expires_at is not None and 590 < info.expires_at - info.created_at <= 600
    result = sandbox.commands.run("echo $GREETING; echo oops >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "hi\n", "oops\n", False)
    assert sandbox.run(["printf", "%s|", "a b", "c"]).stdout == "a b|c|"
    assert sandbox.run_command("cat", stdin="piped").stdout == "piped"
    assert sandbox.commands.run("pwd; echo $X", cwd="/tmp", env={"X": "1"}).stdout == "/tmp\n1\n"
    slow = sandbox.commands.run("sleep 10", timeout=0.5)
    assert slow.timed_out and slow.exit_code is None
    assert sandbox.id in [listed.id for listed in client.list_sandboxes()]
    assert client.get_sandbox(sandbox.id).info == sandbox.refresh().info
    sandbox.delete()
    with pytest.raises(errors.SandboxNotFound):
        client.get_sandbox(sandbox.id)
    with pytest.raises(errors.SandboxNotFound):
        sandbox.run("true")


def test_isolated_runs_leave_nothing_behind(client: SandboxClient) -> None:
    with client.create_sandbox(template="basic") as sandbox:
        sandbox.files.write("input.txt", "data\n")
        result = sandbox.commands.run("cat input.txt; echo out > made.txt; ls", isolated=True)
        assert (result.exit_code, result.stdout) == (0, "data\ninput.txt\nmade.txt\n"), result
        assert not sandbox.files.exists("made.txt")
        streamed: list[str] = []
        assert sandbox.commands.run("echo hi > /tmp/x; cat /tmp/x", isolated=True,
                                    on_stdout=streamed.append).stdout == "hi\n" == "".join(streamed)
        assert not sandbox.files.exists("/tmp/x")


def test_streamed_run_calls_back_while_the_command_still_runs(client: SandboxClient) -> None:
    seen: list[tuple[str, str, float]] = []
    with client.create_sandbox(template="basic") as sandbox:
        result = sandbox.commands.run(
            "echo one; sleep 1; echo two >&2; echo three",
            on_stdout=lambda data: seen.append(("out", data, time.monotonic())),
            on_stderr=lambda data: seen.append(("err", data, time.monotonic())),
        )
        ended = time.monotonic()
    assert (result.exit_code, result.stdout, result.stderr) == (0, "one\nthree\n", "two\n")
    assert "".join(data for kind, data, _ in seen if kind == "out") == "one\nthree\n"
    assert [data for kind, data, _ in seen if kind == "err"] == ["two\n"]
    assert seen[0][1] == "one\n" and ended - seen[0][2] > 0.8, "stdout must arrive before the command ends"


def test_files(client: SandboxClient) -> None:
    with client.create_sandbox(template="basic") as sandbox:
        files = sandbox.files
        files.write("app/calc.py", "x = 1\n")
        assert files.read("app/calc.py") == b"x = 1\n"
        assert files.read_text("/home/user/app/calc.py") == "x = 1\n"
        assert sandbox.run("cat app/calc.py").stdout == "x = 1\n"
        files.write("bin/tool", b"\x00\xff", mode=0o755)
        tool = files.stat("bin/tool")
        assert (tool.type, tool.size, tool.mode, tool.path) == ("file", 2, 0o755, "/home/user/bin/tool")
        assert files.exists("app/calc.py") and not files.exists("app/missing.py")
        files.mkdir("empty/nested")
        assert {"app", "bin", "empty"} <= {entry.name for entry in files.list(".")}
        assert [entry.type for entry in files.list("empty")] == ["dir"]
        files.remove("app/calc.py")
        assert not files.exists("app/calc.py")
        with pytest.raises(errors.Conflict):
            files.remove("empty")
        files.remove("empty", recursive=True)
        with pytest.raises(errors.FileNotFound):
            files.read("app/calc.py")
        with pytest.raises(errors.FileNotFound):
            files.stat("nowhere")
        with pytest.raises(errors.InvalidPath):
            files.write("app/..", "x")
        with pytest.raises(errors.InvalidPath):
            files.read("bad\0path")


def test_directories_round_trip_through_archives(client: SandboxClient, tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "pkg").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "pkg" / "__init__.py").write_text("VALUE = 42\n")
    (source / "pkg" / "data.bin").write_bytes(os.urandom(100_000))
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o755)
    (source / "link").symlink_to("pkg/data.bin")
    with client.create_sandbox(template="basic") as sandbox:
        assert sandbox.files.upload_dir(source, "project") == 6
        checked = sandbox.run("cd project && ./run.sh && readlink link && cmp link pkg/data.bin && ls -d empty")
        assert checked.stdout == "ran\npkg/data.bin\nempty\n", checked.stderr
        sandbox.run("cd project && echo new > pkg/new.txt && ln -s /usr/bin/python3 py")
        copy = tmp_path / "copy"
        sandbox.files.download_dir("project", copy)
    assert (copy / "pkg" / "data.bin").read_bytes() == (source / "pkg" / "data.bin").read_bytes()
    assert (copy / "pkg" / "new.txt").read_text() == "new\n"
    assert (copy / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (copy / "link").readlink() == Path("pkg/data.bin")
    assert (copy / "py").readlink() == Path("/usr/bin/python3")
    assert (copy / "empty").is_dir()


def test_fork_snapshot_and_reset(client: SandboxClient) -> None:
    with client.create_sandbox(template="basic") as sandbox:
        sandbox.run("echo episode > state.txt")
        children = sandbox.fork(2)
        try:
            assert len({child.id for child in children} | {sandbox.id}) == 3
            assert all(child.info.parent == sandbox.id for child in children)
            for index, child in enumerate(children):
                assert child.run(f"cat state.txt; echo child-{index} > state.txt").stdout == "episode\n"
            assert [child.files.read_text("state.txt") for child in children] == ["child-0\n", "child-1\n"]
            assert sandbox.files.read_text("state.txt") == "episode\n"
            snapshot = sandbox.snapshot("after-episode")
        finally:
            for child in children:
                child.delete()
        assert (snapshot.name, snapshot.template) == ("after-episode", "basic")
        assert "after-episode" in [listed.name for listed in client.list_snapshots()]
        with client.create_sandbox(snapshot="after-episode") as restored:
            assert restored.info.snapshot == "after-episode"
            assert restored.files.read_text("state.txt") == "episode\n"
        claim_id = sandbox.id
        assert sandbox.reset().id == claim_id
        assert not sandbox.files.exists("state.txt")
        assert sandbox.run("cat /opt/data/file").stdout == "baseline\n"
    client.delete_snapshot("after-episode")
    with pytest.raises(errors.SnapshotNotFound):
        client.create_sandbox(snapshot="after-episode")


def test_pause_and_resume(client: SandboxClient) -> None:
    with client.create_sandbox(template="basic") as sandbox:
        assert sandbox.pause().info.state == "paused"
        assert client.get_sandbox(sandbox.id).info.state == "paused"
        with pytest.raises(errors.SandboxNotRunning):
            sandbox.run("true")
        with pytest.raises(errors.SandboxNotRunning):
            sandbox.run("true", on_stdout=print)
        assert sandbox.resume().info.state == "running"
        assert sandbox.run("echo back").stdout == "back\n"


def test_stats_report_what_the_sandbox_uses(client: SandboxClient) -> None:
    with client.create_sandbox(template="basic") as sandbox:
        sandbox.run("head -c 3000000 /dev/zero > zeros; python3 -c 'sum(range(3_000_000))'")
        stats = sandbox.stats()
        assert stats.disk_bytes >= 3_000_000 and stats.cpu_seconds > 0 and stats.memory_peak_bytes > 0
        assert stats.pids >= 1
    with pytest.raises(errors.SandboxNotFound):
        sandbox.stats()


def test_context_managers_delete_on_the_way_out(client: SandboxClient) -> None:
    with pytest.raises(RuntimeError), client.create_sandbox(template="basic") as sandbox:
        raise RuntimeError("the episode failed")
    with pytest.raises(errors.SandboxNotFound):
        client.get_sandbox(sandbox.id)
    with client.create_sandbox(template="basic") as deleted_inside:
        deleted_inside.delete()
    assert deleted_inside.id not in [listed.id for listed in client.list_sandboxes()]


def test_mistakes_raise_typed_errors(client: SandboxClient, url: str) -> None:
    with pytest.raises(errors.TemplateNotFound):
        client.create_sandbox(template="no-such-template")
    with pytest.raises(errors.SandboxNotFound):
        client.get_sandbox("no-such-sandbox")
    with pytest.raises(errors.InvalidRequest, match=r"shutdown_after: .*not a duration"):
        client.create_sandbox(template="basic", shutdown_after="soon")
    with pytest.raises(errors.InvalidRequest, match="templat: Extra inputs"):
        client.create_sandbox(templat="basic")  # type: ignore[call-arg]
    with pytest.raises(errors.InvalidRequest, match="give a template"):
        client.create_sandbox()
    with pytest.raises(errors.Unauthorized):
        SandboxClient(url, token="wrong").list_sandboxes()
    with pytest.raises(errors.Unauthorized):
        SandboxClient(url, token="").list_sandboxes()
    with client.create_sandbox(template="basic") as mine:
        bob = SandboxClient(url, token="bob-token")
        with pytest.raises(errors.SandboxNotFound):
            bob.get_sandbox(mine.id)
        assert mine.id not in [listed.id for listed in bob.list_sandboxes()]


def test_the_async_client_does_the_same_with_await(url: str, client: SandboxClient, tmp_path: Path) -> None:
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "a.txt").write_text("A\n")

    async def episode() -> None:
        async with AsyncSandboxClient(url, token="alice-token") as aclient:
            assert "basic" in [template.name for template in await aclient.list_templates()]
            async with aclient.create_sandbox(template="basic") as sandbox:
                assert (await sandbox.commands.run("echo hi")).stdout == "hi\n"
                chunks: list[str] = []
                streamed = await sandbox.run("echo a; sleep 0.2; echo b", on_stdout=chunks.append)
                assert "".join(chunks) == streamed.stdout == "a\nb\n"
                await sandbox.files.write("notes.txt", "n\n")
                assert await sandbox.files.read_text("notes.txt") == "n\n"
                assert await sandbox.files.exists("notes.txt")
                assert await sandbox.files.upload_dir(tmp_path / "up", "up") == 1
                await sandbox.files.download_dir("up", tmp_path / "down")
                children = await sandbox.fork(3)
                outputs = await asyncio.gather(*(child.run("cat notes.txt") for child in children))
                assert [output.stdout for output in outputs] == ["n\n"] * 3
                await asyncio.gather(*(child.delete() for child in children))
                await sandbox.pause()
                assert (await aclient.get_sandbox(sandbox.id)).info.state == "paused"
                await sandbox.resume()
                await sandbox.reset()
                assert not await sandbox.files.exists("notes.txt")
                with pytest.raises(errors.InvalidPath):
                    await sandbox.files.write("x/..", "x")
            with pytest.raises(errors.SandboxNotFound):
                await aclient.get_sandbox(sandbox.id)
            plain = await aclient.create_sandbox(template="basic")
            await plain.delete()
            with pytest.raises(errors.TemplateNotFound):
                await aclient.create_sandbox(template="no-such-template")

    asyncio.run(episode())
    assert (tmp_path / "down" / "a.txt").read_text() == "A\n"
