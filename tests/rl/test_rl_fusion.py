"""The SandboxFusion gateway, driven by the real `sandbox-fusion` client against real sandboxes."""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox.cli.fusion import KEY_ENV
from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.rl.fusion import fusion_app
from rollbox.server.capability import SecretPath, new_key
from rollbox.server.threaded import ThreadServer
from tests.support.users import NOBODY, connect_as

fusion = pytest.importorskip("sandbox_fusion")


@pytest.fixture(scope="module", params=["isolated", "fresh"])
def endpoint(url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """The gateway on a free port under its secret path, in front of a real router, with each kind of isolation."""
    key = new_key()
    app = SecretPath(fusion_app(AsyncSandboxClient(url), isolation=request.param), key)
    with ThreadServer(app, tcp=True) as gateway:
        yield f"{gateway.url}/{key}"


def run(endpoint: str, **request: object) -> fusion.RunCodeResponse:
    return fusion.run_code(fusion.RunCodeRequest(**request), endpoint=endpoint, max_attempts=1)


def test_ping(endpoint: str) -> None:
    assert httpx.get(f"{endpoint}/v1/ping").json() == "pong"


def test_nothing_answers_without_the_key(endpoint: str) -> None:
    """Whoever reaches the port but lacks the key runs nothing (tests/test_capability.py attacks the key itself)."""
    origin = endpoint.rpartition("/")[0]
    assert httpx.get(f"{origin}/v1/ping").status_code == 404
    answer = httpx.post(f"{origin}/run_code", json={"code": "print(1)", "language": "python"})
    assert answer.status_code == 404 and "Success" not in answer.text


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


def test_requests_never_see_each_other(endpoint: str) -> None:
    """Whatever a request leaves (files anywhere it can write, background processes) is gone for the next."""
    first = run(endpoint, language="bash", code="echo left | tee /tmp/mark /var/tmp/mark ~/mark /work/mark "
                "/dev/shm/mark >/dev/null; mkdir -p ~/.config/x; (setsid sleep 60 &); echo ok")
    second = run(endpoint, language="bash", code="ls -A /tmp /var/tmp ~ /work /dev/shm | grep -v fusion- ; "
                 "pgrep sleep || echo no-sleep")
    assert first.run_result.stdout == "ok\n"
    assert "mark" not in second.run_result.stdout and ".config" not in second.run_result.stdout
    assert second.run_result.stdout.strip().endswith("no-sleep")


def test_verl_payload(endpoint: str) -> None:
    """verl's sandbox_fusion reward posts this exact JSON (with fields the gateway ignores) to the URL."""
    payload = {"compile_timeout": 10, "run_timeout": 10, "code": "print(2 + 2)", "stdin": None,
               "memory_limit_MB": 1024, "language": "python", "files": {}, "fetch_files": []}
    answer = httpx.post(f"{endpoint}/run_code", json=payload, timeout=30).json()
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "4\n"


def test_concurrent_requests_in_one_sandbox_stay_apart(endpoint: str) -> None:
    """Requests running at the same time (several share a sandbox in the isolated mode) each see only their own
    files, and one's background process does not outlive it."""
    def one(index: int) -> tuple[str, str]:
        code = f"echo {index} > /tmp/shared; (setsid sleep 61 &); sleep 1; cat /tmp/shared"
        answer = httpx.post(f"{endpoint}/run_code", json={"code": code, "language": "bash"}, timeout=60).json()
        return answer["run_result"]["stdout"], answer["executor_pod_name"]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    assert [stdout for stdout, _ in answers] == [f"{index}\n" for index in range(8)], answers
    assert "sleep" not in run(endpoint, code="ps -eo args", language="bash").run_result.stdout


def pinged(http: httpx.Client, url: str = "http://gateway/v1/ping") -> bool:
    try:
        return http.get(url).json() == "pong"
    except httpx.TransportError:
        return False


GATEWAY = [str(Path(sys.executable).with_name("rollbox")), "fusion"]
"""The standalone gateway's command line."""


@contextlib.contextmanager
def gateway_process(*args: str, **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """The standalone gateway in a child process, killed on exit if the test left it running."""
    gateway = subprocess.Popen([*GATEWAY, *args], stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible,
                               **popen)
    try:
        yield gateway
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()


def _interruptible() -> None:
    """SIGINT at its default in the child, as Ctrl-C finds a command started from a shell: a child inherits an
    ignored signal, and an earlier test's process can leave SIGINT ignored for the runner's children, where Python
    never raises KeyboardInterrupt and the gateway would exit 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until_pinged(http: httpx.Client, gateway: subprocess.Popen[str], url: str = "http://gateway/v1/ping") -> None:
    deadline = time.monotonic() + 30
    while not pinged(http, url):
        assert gateway.poll() is None, gateway.communicate()
        assert time.monotonic() < deadline, "the gateway never answered"
        time.sleep(0.1)


def assert_runs_code(http: httpx.Client, url: str) -> None:
    answer = http.post(url, json={"code": "print(6 * 7)", "language": "python"}).json()
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "42\n"


def assert_stops_on(gateway: subprocess.Popen[str], number: signal.Signals = signal.SIGTERM) -> None:
    """The gateway stops on SIGTERM (exit 0) and on Ctrl-C (SIGINT, exit 130) alike."""
    gateway.send_signal(number)
    assert gateway.wait(timeout=30) == (130 if number == signal.SIGINT else 0), gateway.communicate()


def refused(*args: str, **run: Any) -> subprocess.CompletedProcess[str]:
    """The gateway started with `args`, expected to give up at once."""
    return subprocess.run([*GATEWAY, *args], capture_output=True, text=True, timeout=60, **run)


def test_the_gateway_alone_on_a_socket_serves_only_its_user(url: str, tmp_path: Path) -> None:
    """`rollbox fusion --socket PATH`: it takes no tokens, so on a shared machine only a 0600
    socket keeps other users from running code in its sandboxes."""
    path = tmp_path / "run" / "fusion.sock"
    with gateway_process("--url", url, "--socket", str(path)) as gateway:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path))) as http:
            wait_until_pinged(http, gateway)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            assert connect_as(NOBODY, str(path)) == errno.EACCES
            assert_runs_code(http, "http://gateway/run_code")
        assert_stops_on(gateway)
        assert not path.exists(), "the gateway takes its socket away when it stops"
    (tmp_path / "notes.txt").write_text("keep me")
    done = refused("--url", url, "--socket", str(tmp_path / "notes.txt"))
    assert done.returncode == 1 and "not a socket" in done.stderr and "Traceback" not in done.stderr


def test_the_gateway_alone_on_tcp_answers_only_under_the_key_it_prints(url: str) -> None:
    """`rollbox fusion --port 0`: its clients send no token, so it serves under a random key, and prints
    the endpoint once it listens (with the free port it took)."""
    environment = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    with gateway_process("--url", url, "--port", "0", stdout=subprocess.PIPE, env=environment) as gateway:
        assert gateway.stdout is not None
        line = gateway.stdout.readline()
        endpoint = line.split()[2]
        origin, _, key = endpoint.rpartition("/")
        assert origin.startswith("http://127.0.0.1:") and not origin.endswith(":0") and len(key) >= 32, line
        with httpx.Client(base_url=endpoint) as http:
            wait_until_pinged(http, gateway, "/v1/ping")
            assert_runs_code(http, "/run_code")
        assert httpx.get(f"{origin}/v1/ping").status_code == 404
        assert_stops_on(gateway)


def test_a_short_key_or_a_taken_port_is_refused_clearly(url: str) -> None:
    done = refused("--url", url, "--port", "0", env={**os.environ, KEY_ENV: "guessable"})
    assert done.returncode == 1 and "at least 16 characters" in done.stderr and "Traceback" not in done.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        done = refused("--url", url, "--port", port)
    assert done.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not done.stdout, "no endpoint is printed for a port not taken"


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_gateway_stopped_deletes_the_sandboxes_it_claimed(url: str, tmp_path: Path, number: signal.Signals) -> None:
    """Stopped by a timeout, a scheduler or Ctrl-C, the gateway gives back the sandboxes it claimed: none outlives
    it, taking room from the router's other tenants."""
    path = tmp_path / "fusion.sock"
    with SandboxClient(url) as router:
        before = {sandbox.id for sandbox in router.list_sandboxes()}
        with gateway_process("--url", url, "--socket", str(path)) as gateway:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=60) as http:
                wait_until_pinged(http, gateway)
                with ThreadPoolExecutor(12) as pool:  # more at once than one shared sandbox runs
                    list(pool.map(lambda _: assert_runs_code(http, "http://gateway/run_code"), range(12)))
            claimed = {sandbox.id for sandbox in router.list_sandboxes()} - before
            assert claimed, "the gateway holds the sandboxes it ran code in"
            assert_stops_on(gateway, number)
        assert claimed.isdisjoint(sandbox.id for sandbox in router.list_sandboxes())
