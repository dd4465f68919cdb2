"""The SDK: error mapping, retry policy, stream decoding and archives, then the real thing against a server."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from rollbox import errors
from rollbox.client import AsyncSandboxClient, ConnectionFailed, SandboxClient, _archive
from rollbox.client._calls import ApplyReader, ExecReader
from rollbox.client._http import Answer, answer_of, error_from
from tests.support.servers import TEMPLATE


def _response(status: int, body: object, path: str = "/v1/templates/x") -> Answer:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return answer_of(httpx.Response(status, content=content, request=httpx.Request("GET", f"http://router{path}")))


# -- errors -----------------------------------------------------------------------------------


def test_error_bodies_become_the_typed_errors_of_rollbox_errors() -> None:
    error = error_from(_response(404, {"error": {"code": "template_not_found", "message": "apply it first"}}))
    assert type(error) is errors.TemplateNotFound
    assert str(error) == "apply it first"
    assert type(error_from(_response(400, {"error": {"code": "invalid_path", "message": "m"}}))) is errors.InvalidPath


def test_unknown_codes_and_foreign_bodies_still_raise_a_rollbox_error() -> None:
    assert type(error_from(_response(500, {"error": {"code": "from_the_future", "message": "m"}}))) \
        is errors.RollboxError
    proxy = error_from(_response(502, b"<html>Bad Gateway</html>"))
    assert type(proxy) is errors.NodeUnavailable
    assert "GET /v1/templates/x answered 502: <html>Bad Gateway</html>" in str(proxy)
    assert type(error_from(_response(422, {"detail": [{"loc": ["body"]}]}))) is errors.InvalidRequest
    assert type(error_from(_response(404, b""))) is errors.NotFound


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_transport_error_without_a_message_is_named() -> None:
    from rollbox.client._http import connection_failed
    error = connection_failed("http://router", "POST", "/v1/sandboxes", httpx.ReadError(""))
    assert str(error) == "POST /v1/sandboxes to http://router failed: ReadError"


def test_an_unreachable_server_is_one_clear_error() -> None:
    client = SandboxClient(f"http://127.0.0.1:{_free_port()}")
    with pytest.raises(ConnectionFailed, match=r"cannot reach the rollbox server at http://127\.0\.0\.1:\d+ .*serve"):
        client.create_sandbox(template="basic")


# -- retries, against a scripted server on loopback ---------------------------------------------


class _Scripted(ThreadingHTTPServer):
    """Answers each request with the next (status, body) of `script`, and remembers what it was asked."""

    def __init__(self, script: list[tuple[int, object]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.seen: list[str] = []
        self.tokens: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Scripted

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.seen.append(f"{self.command} {self.path}")
        self.server.tokens.append(self.headers.get("authorization"))
        status, body = self.server.script.pop(0)
        content = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[_Scripted]:
    server = _Scripted([])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


BUSY = (503, {"error": {"code": "node_unavailable", "message": "the node is restarting: try again"}})


def test_idempotent_calls_retry_a_503_with_backoff(scripted: _Scripted) -> None:
    scripted.script += [BUSY, BUSY, (200, [])]
    assert SandboxClient(scripted.url).list_sandboxes() == []
    assert scripted.seen == ["GET /v1/sandboxes"] * 3


def test_idempotent_calls_give_up_after_the_last_retry(scripted: _Scripted) -> None:
    scripted.script += [BUSY] * 4
    with pytest.raises(errors.NodeUnavailable, match="restarting"):
        SandboxClient(scripted.url).list_templates()
    assert len(scripted.seen) == 4


def test_calls_that_change_state_are_never_retried(scripted: _Scripted) -> None:
    scripted.script += [BUSY] * 4
    client = SandboxClient(scripted.url)
    with pytest.raises(errors.NodeUnavailable):
        client.create_sandbox(template="basic")
    assert scripted.seen == ["POST /v1/sandboxes"]


def test_the_async_client_retries_as_the_sync_one_does(scripted: _Scripted) -> None:
    scripted.script += [BUSY, BUSY, (200, []), *[BUSY] * 4, BUSY]

    async def calls() -> None:
        async with AsyncSandboxClient(scripted.url) as client:
            assert await client.list_sandboxes() == []
            with pytest.raises(errors.NodeUnavailable, match="restarting"):
                await client.list_templates()
            with pytest.raises(errors.NodeUnavailable):
                await client.create_sandbox(template="basic")

    asyncio.run(calls())
    assert scripted.seen == ["GET /v1/sandboxes"] * 3 + ["GET /v1/templates"] * 4 + ["POST /v1/sandboxes"]


SANDBOX = {"id": "c-1", "template": "basic", "tenant": "t", "state": "running", "created_at": 1.0}
STAT = {"name": "a", "path": "a", "type": "file", "size": 1, "mode": 420, "mtime": 1.0}
SENT = ["POST /v1/sandboxes", "PUT /v1/sandboxes/c-1/files?path=dir%2Fa+b.txt",
        "GET /v1/sandboxes/c-1/files/stat?path=..%2Fetc",
        "GET /v1/sandboxes/c-1/files/list?path=%C3%A9t%C3%A9%3F%23%26"]
"""What the calls below send, to the byte: ids and names are one path segment, paths one query value."""


def test_token_and_paths_go_out_as_the_contract_says(scripted: _Scripted) -> None:
    scripted.script += [(201, SANDBOX), (204, None), (200, STAT), (200, [])]
    box = SandboxClient(scripted.url, token="secret").create_sandbox(template="basic")
    box.files.write("dir/a b.txt", "x")
    box.files.stat("../etc")
    box.files.list("été?#&")
    assert scripted.seen == SENT
    assert scripted.tokens == ["Bearer secret"] * 4


def test_the_async_client_sends_the_same_bytes(scripted: _Scripted) -> None:
    scripted.script += [(201, SANDBOX), (204, None), (200, STAT), (200, [])]

    async def calls() -> None:
        async with AsyncSandboxClient(scripted.url, token="secret") as client:
            box = await client.create_sandbox(template="basic")
            await box.files.write("dir/a b.txt", "x")
            await box.files.stat("../etc")
            await box.files.list("été?#&")

    asyncio.run(calls())
    assert scripted.seen == SENT
    assert scripted.tokens == ["Bearer secret"] * 4


def test_a_router_behind_a_path_prefix_gets_it_on_every_call(scripted: _Scripted) -> None:
    """Both clients send the prefix, and name the path as sent when the proxy answers for the router."""
    scripted.script += [(200, []), (502, "bad gateway")] * 2
    failed = "GET /roll%20box/v1/sandboxes answered 502: \"bad gateway\""
    sync = SandboxClient(f"{scripted.url}/roll box/")
    assert sync.list_sandboxes() == []
    with pytest.raises(errors.NodeUnavailable, match=failed):
        sync.list_sandboxes()

    async def calls() -> None:
        async with AsyncSandboxClient(f"{scripted.url}/roll box") as client:
            assert await client.list_sandboxes() == []
            with pytest.raises(errors.NodeUnavailable, match=failed):
                await client.list_sandboxes()

    asyncio.run(calls())
    assert scripted.seen == ["GET /roll%20box/v1/sandboxes"] * 4


def test_a_token_that_would_break_the_request_head_is_refused_before_sending() -> None:
    for client_class in (SandboxClient, AsyncSandboxClient):
        with pytest.raises(errors.InvalidRequest, match="control or non-ASCII"):
            client_class("http://127.0.0.1:1", token="secret\r\nx-tenant: admin")


# -- streams ------------------------------------------------------------------------------------


def test_the_exec_stream_calls_back_as_output_arrives_and_ends_with_the_result() -> None:
    seen: list[tuple[str, str]] = []
    reader = ExecReader(lambda data: seen.append(("out", data)), lambda data: seen.append(("err", data)))
    assert reader.feed('{"type": "stdout", "data": "a"}') is None
    assert reader.feed('{"type": "stderr", "data": "b"}') is None
    result = reader.feed('{"type": "result", "result": {"exit_code": 3, "stdout": "a", "stderr": "b"}}')
    assert seen == [("out", "a"), ("err", "b")]
    assert result is not None and result.exit_code == 3
    with pytest.raises(errors.SandboxNotFound):
        reader.feed('{"type": "error", "code": "sandbox_not_found", "message": "gone"}')


def test_the_apply_stream_reports_progress_and_raises_errors_once_done() -> None:
    seen: list[str] = []
    reader = ApplyReader(lambda event: seen.append(event.event))
    assert reader.feed('{"event": "progress", "kind": "SandboxTemplate", "name": "a", "message": "step 1"}') is None
    assert reader.feed('{"event": "applied", "kind": "SandboxTemplate", "name": "a", "status": "created"}') is None
    assert reader.feed('{"event": "error", "kind": "SandboxTemplate", "name": "b", "code": "build_failed", '
                       '"message": "step 1 exited 2"}') is None
    with pytest.raises(errors.BuildFailed, match="SandboxTemplate b: step 1 exited 2"):
        reader.feed('{"event": "done"}')
    assert seen == ["progress", "applied", "error"]
    assert [event.name for event in reader.applied] == ["a"]


def test_apply_validates_before_sending_anything() -> None:
    client = SandboxClient(f"http://127.0.0.1:{_free_port()}")
    with pytest.raises(errors.InvalidResource, match=r"spec\.limits\.memory"):
        client.apply("kind: SandboxTemplate\nmetadata: {name: a}\nspec: {limits: {memory: lots}}\n")
    with pytest.raises(errors.InvalidResource, match=r"maxReplicas \(2\) is below replicas \(4\)"):
        client.apply("kind: SandboxWarmPool\nmetadata: {name: p}\n"
                     "spec: {replicas: 4, maxReplicas: 2, sandboxTemplateRef: {name: a}}\n")
    with pytest.raises(errors.InvalidResource, match="holds no resources"):
        client.apply("---\n")
    with pytest.raises(errors.InvalidRequest, match=r"cannot read /nonexistent\.yaml"):
        client.apply("/nonexistent.yaml")


# -- archives ---------------------------------------------------------------------------------


def test_archives_round_trip_a_tree_with_links(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "pkg" / "sub").mkdir(parents=True)
    (source / "pkg" / "sub" / "data.bin").write_bytes(bytes(range(256)))
    (source / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (source / "run.sh").chmod(0o755)
    (source / "link").symlink_to("pkg/sub/data.bin")
    _archive.unpack(_archive.pack(source), tmp_path / "copy")
    copy = tmp_path / "copy"
    assert (copy / "pkg" / "sub" / "data.bin").read_bytes() == bytes(range(256))
    assert (copy / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (copy / "link").readlink() == Path("pkg/sub/data.bin")


def test_unpacking_refuses_members_that_leave_the_directory(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.OutsideDestinationError):
        _archive.unpack(buffer.getvalue(), tmp_path / "inside")
    assert not (tmp_path / "escaped").exists()


def test_unpacking_keeps_links_that_point_out_but_never_writes_through_them(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("python")
        link.type, link.linkname = tarfile.SYMTYPE, "/usr/bin/python3"
        tar.addfile(link)
        out = tarfile.TarInfo("out")
        out.type, out.linkname = tarfile.SYMTYPE, str(tmp_path)
        tar.addfile(out)
        through = tarfile.TarInfo("out/escaped")
        through.size = 1
        tar.addfile(through, io.BytesIO(b"x"))
    with pytest.raises(tarfile.OutsideDestinationError):
        _archive.unpack(buffer.getvalue(), tmp_path / "inside")
    assert (tmp_path / "inside" / "python").readlink() == Path("/usr/bin/python3")
    assert not (tmp_path / "escaped").exists()


# -- the real thing: the SDK against a server on loopback, over a real node and engine -----------


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
