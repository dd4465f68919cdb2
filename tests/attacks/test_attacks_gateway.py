"""Attacks on the model gateway from inside sandboxes: reaching past it (other ports, the host's services, other
hosts, the node's API through it), taking its address, using another sandbox's key or a dead sandbox's key, and
flooding it. The upstream is a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from rollbox import errors
from tests.support.openai_server import Scripted

PROBE = r'''
import json, os, socket, sys, urllib.error, urllib.request
out = {}
for host, port in json.loads(sys.argv[1]):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); out[f"{host}:{port}"] = "open"
    except OSError as error:
        out[f"{host}:{port}"] = type(error).__name__ + (f":{error.errno}" if error.errno else "")
    finally:
        s.close()
try:
    s = socket.socket(); s.bind(("127.0.0.1", 80)); out["bind80"] = "bound"
except OSError as error:
    out["bind80"] = type(error).__name__
out["interfaces"] = sorted(os.listdir("/sys/class/net"))
def ask(method, path, key, body=None):
    request = urllib.request.Request("http://127.0.0.1" + path, method=method, data=body,
                                     headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return type(error).__name__
chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
out["asks"] = {name: ask(method, path, key, chat if method == "POST" else None)
               for name, (method, path, key) in json.loads(sys.argv[2]).items()}
print(json.dumps(out))
'''


def probe(sandbox: object, targets: list[tuple[str, int]], asks: dict[str, tuple[str, str, str]]) -> dict:
    result = sandbox.commands.run(["python3", "-c", PROBE, json.dumps(targets), json.dumps(asks)],  # type: ignore[attr-defined]
                                  timeout=120)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def key_of(sandbox: object) -> str:
    return sandbox.commands.run("printf %s $OPENAI_API_KEY").stdout  # type: ignore[attr-defined]


def test_nothing_past_the_gateway(scripted: Scripted) -> None:
    client, upstream = scripted.client, scripted.upstream
    model = scripted.model
    upstream_port = int(upstream.rsplit(":", 1)[1].split("/")[0])
    with client.create_sandbox(template="rl-python", warmpool="rl-python",
                               model_gateway={"upstream": upstream}) as sandbox:
        key = key_of(sandbox)
        found = probe(sandbox, [("127.0.0.1", 80), ("127.0.0.1", 81), ("127.0.0.1", 8080),
                                ("127.0.0.1", upstream_port), ("169.254.169.254", 80), ("10.200.0.1", 80)], {
            "chat": ("POST", "/v1/chat/completions", key),
            "node api": ("GET", "/v1/sandboxes", key),
            "health": ("GET", "/healthz", key),
            "dotdot": ("POST", "/v1/../v1/sandboxes", key),
            "encoded": ("POST", "/v1/chat%2F..%2F..%2Fv1%2Fsandboxes", key),
        })
        # Only the gateway's own address answers; the host's loopback (where the upstream is) is not the sandbox's.
        assert found["127.0.0.1:80"] == "open"
        assert {found[f"127.0.0.1:{port}"] for port in (81, 8080, upstream_port)} == {"ConnectionRefusedError:111"}
        assert found["169.254.169.254:80"] == found["10.200.0.1:80"] == "OSError:101"  # no route: nothing sent
        assert found["interfaces"] == ["lo"] and found["bind80"] == "PermissionError"
        assert found["asks"] == {"chat": 200, "node api": 404, "health": 404, "dotdot": 404, "encoded": 404}
    # The upstream never saw the sandbox's key: the gateway sends the claim's (none here).
    assert all("authorization" not in headers for headers in model.headers)


def test_without_a_gateway_nothing_answers(scripted: Scripted) -> None:
    client = scripted.client
    with client.create_sandbox(template="rl-python", warmpool="rl-python") as sandbox:
        found = probe(sandbox, [("127.0.0.1", 80)], {"chat": ("POST", "/v1/chat/completions", "rbx-anything")})
        assert sandbox.commands.run("printenv OPENAI_API_KEY").exit_code == 1
    assert found["127.0.0.1:80"] == "ConnectionRefusedError:111" and found["bind80"] == "PermissionError"
    assert found["asks"]["chat"] == "URLError"


def test_keys_open_only_their_own_sandbox(scripted: Scripted) -> None:
    client, upstream = scripted.client, scripted.upstream
    gateway = {"upstream": upstream}
    first = client.create_sandbox(template="rl-python", warmpool="rl-python", model_gateway=gateway)
    with client.create_sandbox(template="rl-python", warmpool="rl-python", model_gateway=gateway) as second:
        first_key, second_key = key_of(first), key_of(second)
        assert first_key != second_key
        asks = {"own": ("POST", "/v1/chat/completions", second_key),
                "other": ("POST", "/v1/chat/completions", first_key),
                "none": ("POST", "/v1/chat/completions", "")}
        assert probe(second, [], asks)["asks"] == {"own": 200, "other": 401, "none": 401}
        assert probe(first, [], {"other": ("POST", "/v1/chat/completions", second_key)})["asks"] == {"other": 401}
        first.delete()
        assert probe(second, [], {"dead": ("POST", "/v1/chat/completions", first_key)})["asks"] == {"dead": 401}
        with pytest.raises(errors.SandboxNotFound):
            first.model_calls()
        assert second.model_calls().count == 1  # refused calls with a wrong key are not the agent's: not recorded


def test_flood_is_refused_whole(scripted: Scripted) -> None:
    client, upstream = scripted.client, scripted.upstream
    flood = ("import os, urllib.request, urllib.error\n"
             "r = urllib.request.Request('http://127.0.0.1/v1/chat/completions', data=b'{' + b' ' * (33 << 20),"
             " headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
             "try:\n urllib.request.urlopen(r)\nexcept urllib.error.HTTPError as e:\n print(e.code)\n")
    with client.create_sandbox(template="rl-python", warmpool="rl-python",
                               model_gateway={"upstream": upstream}) as sandbox:
        result = sandbox.commands.run(["python3", "-c", flood], timeout=120)
        assert result.stdout.strip() == "400", result.stderr
        assert sandbox.model_calls().count == 0


@pytest.mark.runsc
def test_gvisor_is_refused_clearly(scripted: Scripted, tmp_path: Path) -> None:
    client, upstream = scripted.client, scripted.upstream
    """gVisor's sandboxes keep their network in gVisor's own kernel: the claim is refused, not half served."""
    if shutil.which("runsc") is None:
        pytest.skip("runsc is not installed")
    template = tmp_path / "gvisor.yaml"
    template.write_text("apiVersion: rollbox.dev/v1alpha1\nkind: SandboxTemplate\nmetadata: {name: gvisor-gw}\n"
                        "spec: {runtime: runsc}\n")
    client.apply(str(template))
    with pytest.raises(errors.InvalidRequest, match="runc template"):
        client.create_sandbox(template="gvisor-gw", model_gateway={"upstream": upstream})
    assert not [s for s in client.list_sandboxes() if s.info.template == "gvisor-gw"]


def test_a_stream_in_flight_ends_with_its_sandbox(scripted: Scripted, capfd: pytest.CaptureFixture[str]) -> None:
    """Deleting a sandbox while its agent streams an answer cuts the stream; the node logs no error and goes on."""
    client, upstream = scripted.client, scripted.upstream
    ask = ("import json, os, urllib.request\n"
           "r = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', headers={"
           "'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']}, data=json.dumps({'model': 'm', 'stream': True,"
           " 'messages': [{'role': 'user', 'content': ' '.join(['w'] * 400)}]}).encode())\n"
           "for line in urllib.request.urlopen(r): print(line.decode().strip()[:20], flush=True)\n")
    scripted.model.delay = 0.05
    try:
        sandbox = client.create_sandbox(template="rl-python", warmpool="rl-python",
                                        model_gateway={"upstream": upstream})
        streaming = sandbox.commands.run(["python3", "-c", ask], background=True)
        chunks = 0
        for event in streaming.events(0):
            chunks += event.data.count("data:") if event.type == "stdout" else 0
            if chunks > 3:
                break
        started = time.monotonic()
        sandbox.delete()
    finally:
        scripted.model.delay = 0.0
    with client.create_sandbox(template="rl-python", warmpool="rl-python",
                               model_gateway={"upstream": upstream}) as next_one:
        assert probe(next_one, [], {"chat": ("POST", "/v1/chat/completions", key_of(next_one))})["asks"] == {
            "chat": 200}
    assert time.monotonic() - started < 10  # the 20 s stream was cut, not waited for
    assert any(call["messages"][0]["content"].startswith("w w") for call in scripted.model.requests)
    logged = capfd.readouterr()
    assert "Traceback" not in logged.err + logged.out and "ERROR" not in logged.err
