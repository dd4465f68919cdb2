"""The sync SDK's side of the wire, answered in-process by `httpx.MockTransport`: what it sends, how it decodes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from rollbox import errors
from rollbox.client import Sandbox, SandboxClient
from rollbox.models import ExecResult, FileInfo, Health, SandboxInfo

URL = "http://router.test"
INFO = {"id": "sb-1", "template": "basic", "tenant": "alice", "state": "running", "created_at": 1.0}


class Router:
    """Answers each call from a table keyed by (method, path) and keeps the requests it saw."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], httpx.Response] = {}
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        return self.answers.get((request.method, request.url.path),
                                httpx.Response(404, json={"error": {"code": "not_found", "message": "no such route"}}))


@pytest.fixture
def router() -> Router:
    return Router()


def claimed(router: Router, client: SandboxClient) -> Sandbox:
    router.answers["GET", "/v1/sandboxes/sb-1"] = httpx.Response(200, json=INFO)
    return client.get_sandbox("sb-1")


@pytest.fixture
def client(router: Router) -> Iterator[SandboxClient]:
    with SandboxClient(URL, token="alice-token", transport=httpx.MockTransport(router)) as client:
        yield client


def test_a_claim_sends_only_what_was_asked_and_decodes_the_sandbox(router: Router, client: SandboxClient) -> None:
    router.answers["POST", "/v1/sandboxes"] = httpx.Response(201, json={**INFO, "labels": {"run": "7"}})
    sandbox = client.create_sandbox(template="basic", labels={"run": "7"})
    assert sandbox.id == "sb-1" and sandbox.info == SandboxInfo(**INFO, labels={"run": "7"})
    request = router.seen[-1]
    assert request.headers["authorization"] == "Bearer alice-token"
    sent = json.loads(request.content)
    assert sent == {"template": "basic", "labels": {"run": "7"}, "request_key": sent["request_key"]}


def test_fields_the_sdk_does_not_know_are_ignored(router: Router, client: SandboxClient) -> None:
    """An older SDK keeps working against a newer router."""
    router.answers["GET", "/v1/sandboxes"] = httpx.Response(200, json=[{**INFO, "zone": "eu", "gpu": True}])
    assert [sandbox.info for sandbox in client.list_sandboxes()] == [SandboxInfo(**INFO)]
    router.answers["GET", "/healthz"] = httpx.Response(200, json={"status": "ok", "sandboxes": 2, "shards": 3})
    assert client.health() == Health(status="ok", sandboxes=2)


def test_commands_and_files_decode_their_answers(router: Router, client: SandboxClient) -> None:
    router.answers["POST", "/v1/sandboxes"] = httpx.Response(201, json=INFO)
    router.answers["POST", "/v1/sandboxes/sb-1/exec"] = httpx.Response(200, json={"exit_code": 3, "stderr": "no\n"})
    router.answers["GET", "/v1/sandboxes/sb-1/files"] = httpx.Response(200, content=b"\x00\xff")
    stat = {"path": "/a", "name": "a", "type": "file", "size": 2, "mode": 420, "mtime": 0.0}
    router.answers["GET", "/v1/sandboxes/sb-1/files/stat"] = httpx.Response(200, json=stat)
    router.answers["DELETE", "/v1/sandboxes/sb-1"] = httpx.Response(204)
    sandbox = client.create_sandbox()
    assert sandbox.run(["false"], timeout=5) == ExecResult(exit_code=3, stderr="no\n")
    assert json.loads(router.seen[-1].content) == {"command": ["false"], "timeout": 5, "isolated": False}
    assert sandbox.files.read("/a") == b"\x00\xff" and router.seen[-1].url.params["path"] == "/a"
    assert sandbox.files.stat("/a") == FileInfo(**stat)
    assert sandbox.delete() is None and router.seen[-1].method == "DELETE"


def test_a_streamed_command_calls_back_per_line_and_returns_the_result(router: Router, client: SandboxClient) -> None:
    lines = [{"type": "stdout", "data": "a\n"}, {"type": "stderr", "data": "b\n"}, {"type": "stdout", "data": "c\n"},
             {"type": "result", "result": {"exit_code": 0, "stdout": "a\nc\n", "stderr": "b\n"}}]
    router.answers["POST", "/v1/sandboxes/sb-1/exec/stream"] = httpx.Response(
        200, content="".join(json.dumps(line) + "\n" for line in lines).encode(),
        headers={"content-type": "application/x-ndjson"})
    out: list[str] = []
    err: list[str] = []
    result = claimed(router, client).run("x", on_stdout=out.append, on_stderr=err.append)
    assert (out, err, result.exit_code, result.stdout) == (["a\n", "c\n"], ["b\n"], 0, "a\nc\n")


def test_an_error_line_ends_a_stream_as_the_typed_error(router: Router, client: SandboxClient) -> None:
    lines = [{"type": "stdout", "data": "a\n"}, {"type": "error", "code": "sandbox_not_running", "message": "paused"}]
    router.answers["POST", "/v1/sandboxes/sb-1/exec/stream"] = httpx.Response(
        200, content="".join(json.dumps(line) + "\n" for line in lines).encode())
    with pytest.raises(errors.SandboxNotRunning, match="paused"):
        claimed(router, client).run("x", on_stdout=lambda _: None)


@pytest.mark.parametrize(("answer", "error", "message"), [
    (httpx.Response(404, json={"error": {"code": "sandbox_not_found", "message": "sandbox 'x' does not exist"}}),
     errors.SandboxNotFound, "sandbox 'x' does not exist"),
    (httpx.Response(409, json={"error": {"code": "sandbox_not_running", "message": "it is paused"}}),
     errors.SandboxNotRunning, "it is paused"),
    (httpx.Response(418, json={"error": {"code": "from_the_future", "message": "new"}}), errors.RollboxError, "new"),
    (httpx.Response(502, text="<html>Bad Gateway</html>"), errors.NodeUnavailable, "502"),
    (httpx.Response(422, json={"detail": "a framework's own body"}), errors.InvalidRequest, "422"),
])
def test_error_answers_raise_the_typed_error(router: Router, client: SandboxClient, answer: httpx.Response,
                                             error: type[errors.RollboxError], message: str) -> None:
    router.answers["DELETE", "/v1/sandboxes/x"] = answer
    with pytest.raises(error, match=message) as raised:
        client.delete_sandbox("x")
    assert isinstance(raised.value, errors.RollboxError)


def test_a_file_that_is_not_there_does_not_exist_but_other_errors_still_raise(router: Router,
                                                                              client: SandboxClient) -> None:
    missing = {"error": {"code": "file_not_found", "message": "'/a' does not exist"}}
    router.answers["GET", "/v1/sandboxes/sb-1/files/stat"] = httpx.Response(404, json=missing)
    sandbox = claimed(router, client)
    assert sandbox.files.exists("/a") is False
    gone = {"error": {"code": "sandbox_not_found", "message": "gone"}}
    router.answers["GET", "/v1/sandboxes/sb-1/files/stat"] = httpx.Response(404, json=gone)
    with pytest.raises(errors.SandboxNotFound):
        sandbox.files.exists("/a")
