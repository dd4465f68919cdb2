"""The SDK on its own: error mapping, retry policy and request bytes (against a scripted server on loopback),
stream decoding and archives."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from rollbox import archives, errors
from rollbox.client import AsyncSandboxClient, ConnectionFailed, SandboxClient
from rollbox.client import _calls as calls
from rollbox.client._calls import ApplyReader, ExecReader
from rollbox.client._http import Answer, answer_of, error_from


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
        self.bodies: list[bytes] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Scripted

    def _answer(self) -> None:
        self.server.bodies.append(self.rfile.read(int(self.headers.get("content-length") or 0)))
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
    scripted.script += [BUSY] * 5
    client = SandboxClient(scripted.url)
    with pytest.raises(errors.NodeUnavailable):
        client.create_sandbox(template="basic", request_key=None)
    with pytest.raises(errors.NodeUnavailable):
        client._send(calls.reset("c-1"))
    assert scripted.seen == ["POST /v1/sandboxes", "POST /v1/sandboxes/c-1/reset"]


def test_a_claim_is_sent_again_with_its_request_key_marked_as_a_retry(scripted: _Scripted) -> None:
    """Its key answers the sandbox an earlier attempt made, if it made one: so a claim may be sent again."""
    scripted.script += [BUSY, BUSY, (201, SANDBOX)]
    assert SandboxClient(scripted.url).create_sandbox(template="basic").id == "c-1"
    assert scripted.seen == ["POST /v1/sandboxes", *["POST /v1/sandboxes?retry=true"] * 2]
    keys = {json.loads(body)["request_key"] for body in scripted.bodies}
    assert len(keys) == 1 and len(keys.pop()) == 32
    scripted.script += [(201, SANDBOX)]
    SandboxClient(scripted.url).create_sandbox(template="basic", request_key="mine")
    assert json.loads(scripted.bodies[-1]) == {"template": "basic", "request_key": "mine"}


def test_an_answer_that_says_the_node_is_down_is_not_sent_again(scripted: _Scripted) -> None:
    down = (503, {"error": {"code": "node_unavailable", "message": "node w1 is down", "retry": False}})
    scripted.script += [down, down]
    client = SandboxClient(scripted.url)
    with pytest.raises(errors.NodeUnavailable, match="is down") as raised:
        client.get_sandbox("w1-1")
    assert raised.value.retry is False

    async def call() -> None:
        async with AsyncSandboxClient(scripted.url) as client:
            with pytest.raises(errors.NodeUnavailable, match="is down"):
                await client.get_sandbox("w1-1")

    asyncio.run(call())
    assert scripted.seen == ["GET /v1/sandboxes/w1-1"] * 2


def test_the_async_client_retries_as_the_sync_one_does(scripted: _Scripted) -> None:
    scripted.script += [BUSY, BUSY, (200, []), *[BUSY] * 4, BUSY, BUSY, (201, SANDBOX)]

    async def calls() -> None:
        async with AsyncSandboxClient(scripted.url) as client:
            assert await client.list_sandboxes() == []
            with pytest.raises(errors.NodeUnavailable, match="restarting"):
                await client.list_templates()
            with pytest.raises(errors.NodeUnavailable):
                await client.create_sandbox(template="basic", request_key=None)
            assert (await client.create_sandbox(template="basic")).id == "c-1"

    asyncio.run(calls())
    assert scripted.seen == (["GET /v1/sandboxes"] * 3 + ["GET /v1/templates"] * 4 + ["POST /v1/sandboxes"] * 2
                             + ["POST /v1/sandboxes?retry=true"])


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
    archives.unpack(archives.pack(source), tmp_path / "copy")
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
        archives.unpack(buffer.getvalue(), tmp_path / "inside")
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
        archives.unpack(buffer.getvalue(), tmp_path / "inside")
    assert (tmp_path / "inside" / "python").readlink() == Path("/usr/bin/python3")
    assert not (tmp_path / "escaped").exists()
