"""The SandboxFusion gateway, driven by the real `sandbox-fusion` client against real sandboxes."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from rollbox.client import AsyncSandboxClient
from rollbox.rl.fusion import fusion_app
from tests.rl_support import rl_server

fusion = pytest.importorskip("sandbox_fusion")


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The gateway on a free port, in front of a real router."""
    with rl_server(tmp_path_factory.mktemp("rl-fusion")) as url:
        server = uvicorn.Server(uvicorn.Config(fusion_app(AsyncSandboxClient(url)), host="127.0.0.1", port=0,
                                               log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        server.should_exit = True
        thread.join()


def run(endpoint: str, **request: object) -> fusion.RunCodeResponse:
    return fusion.run_code(fusion.RunCodeRequest(**request), endpoint=endpoint, max_attempts=1)


def test_ping(endpoint: str) -> None:
    assert httpx.get(f"{endpoint}/v1/ping").json() == "pong"


def test_run_code_like_sandbox_fusion(endpoint: str) -> None:
    result = run(endpoint, code="print(1)", language="python")
    assert result.status == fusion.RunStatus.Success
    assert result.run_result.status == fusion.CommandRunStatus.Finished
    assert (result.run_result.stdout, result.run_result.return_code) == ("1\n", 0)

    failed = run(endpoint, code="import sys; print(input()); sys.exit(3)", language="python", stdin="hi\n")
    assert failed.status == fusion.RunStatus.Failed and failed.run_result.return_code == 3
    assert failed.run_result.stdout == "hi\n"

    slow = run(endpoint, code="sleep 5", language="bash", run_timeout=0.5)
    assert slow.run_result.status == fusion.CommandRunStatus.TimeLimitExceeded

    files = run(endpoint, code="cat data.txt | tr a-z A-Z > out.txt", language="bash",
                files={"data.txt": base64.b64encode(b"abc").decode()}, fetch_files=["out.txt", "missing.txt"])
    assert base64.b64decode(files.files["out.txt"]) == b"ABC" and "missing.txt" not in files.files

    with pytest.raises(Exception, match="language 'cpp' is not supported"):  # the client raises on SandboxError
        run(endpoint, code="int main() {}", language="cpp")


def test_requests_are_isolated(endpoint: str) -> None:
    first = run(endpoint, code="echo left > /tmp/mark; (sleep 60 &) ; echo ok", language="bash")
    second = run(endpoint, code="cat /tmp/mark 2>&1; pgrep sleep || echo no-sleep", language="bash")
    assert first.run_result.stdout == "ok\n"
    assert "No such file" in second.run_result.stdout and "no-sleep" in second.run_result.stdout
    assert first.executor_pod_name != second.executor_pod_name


def test_verl_payload(endpoint: str) -> None:
    """verl's sandbox_fusion reward posts this exact JSON (with fields the gateway ignores) to the URL."""
    payload = {"compile_timeout": 10, "run_timeout": 10, "code": "print(2 + 2)", "stdin": None,
               "memory_limit_MB": 1024, "language": "python", "files": {}, "fetch_files": []}
    answer = httpx.post(f"{endpoint}/run_code", json=payload, timeout=30).json()
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "4\n"
