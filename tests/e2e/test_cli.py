"""The `rollbox` command, run as a user runs it (a subprocess of .venv/bin/rollbox) against a real server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from rollbox.client import SandboxClient
from rollbox.engine import Engine
from tests.support.engines import leftovers, teardown_engine
from tests.support.servers import TEMPLATE

ROLLBOX = Path(sys.executable).with_name("rollbox")
RESOURCES = TEMPLATE.replace("name: basic", "name: cli-basic") + """\
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {name: cli-pool}
spec: {replicas: 1, sandboxTemplateRef: {name: cli-basic}}
"""


def rollbox(*args: str, url: str, token: str = "alice-token", stdin: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROLLBOX_URL": url, "ROLLBOX_TOKEN": token}
    return subprocess.run([str(ROLLBOX), *args], capture_output=True, text=True, input=stdin, env=env,
                          timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """What a user mistake must look like: non-zero exit, one line on stderr, no traceback."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rollbox: "), done.stderr
    return lines[0]


def test_apply_then_get_and_delete_resources(url: str, tmp_path: Path) -> None:
    path = tmp_path / "resources.yaml"
    path.write_text(RESOURCES)
    done = rollbox("apply", "-f", str(path), url=url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["template/cli-basic created", "warmpool/cli-pool created"]
    assert rollbox("apply", "-f", "-", "--wait", url=url, stdin=RESOURCES).stdout.splitlines() == [
        "template/cli-basic unchanged", "warmpool/cli-pool unchanged", "warmpool/cli-pool full"]

    table = rollbox("get", "templates", url=url).stdout
    assert table.split()[:5] == ["NAME", "BASE", "RUNTIME", "STEPS", "AGE"]
    assert any(line.split()[:4] == ["cli-basic", "host", "runc", "1"] for line in table.splitlines())
    (template,) = json.loads(rollbox("get", "template", "cli-basic", "-o", "json", url=url).stdout)
    assert template["name"] == "cli-basic" and template["spec"]["runtime"] == "runc"
    (pool,) = yaml.safe_load(rollbox("get", "pool", "cli-pool", "-o", "yaml", url=url).stdout)
    assert (pool["template"], pool["replicas"], pool["ready"]) == ("cli-basic", 1, 1)
    assert "cli-pool" in rollbox("get", "warmpools", url=url).stdout

    assert rollbox("delete", "warmpool", "cli-pool", url=url).stdout == "warmpool/cli-pool deleted\n"
    assert rollbox("delete", "templates", "cli-basic", url=url).stdout == "template/cli-basic deleted\n"
    assert "template 'cli-basic'" in one_line_error(rollbox("get", "template", "cli-basic", url=url))


def test_apply_errors_are_one_line(url: str, tmp_path: Path) -> None:
    assert "cannot read" in one_line_error(rollbox("apply", "-f", str(tmp_path / "missing.yaml"), url=url))
    broken = RESOURCES.replace("replicas: 1", "replicas: many")
    assert "spec.replicas" in one_line_error(rollbox("apply", "-f", "-", url=url, stdin=broken))
    failing = TEMPLATE.replace("name: basic", "name: cli-broken").replace("mkdir", "exit 7; mkdir")
    assert "cli-broken" in one_line_error(rollbox("apply", "-f", "-", url=url, stdin=failing))
    assert "admin" in one_line_error(rollbox("apply", "-f", "-", url=url, token="bob-token", stdin=RESOURCES))


def test_ls_get_and_delete_sandboxes_and_snapshots(url: str, client: SandboxClient) -> None:
    sandbox = client.create_sandbox(template="basic")
    listed = rollbox("ls", url=url).stdout.splitlines()
    assert listed[0].split()[:4] == ["ID", "TEMPLATE", "WARMPOOL", "STATE"]
    assert [sandbox.id, "basic", "-", "running"] in [line.split()[:4] for line in listed[1:]]
    (shown,) = json.loads(rollbox("get", "sandbox", sandbox.id, "-o", "json", url=url).stdout)
    assert (shown["id"], shown["tenant"]) == (sandbox.id, "alice")
    assert sandbox.id not in rollbox("ls", url=url, token="bob-token").stdout

    sandbox.snapshot("cli-snap")
    assert "cli-snap" in rollbox("get", "snapshots", url=url).stdout
    assert rollbox("delete", "snapshot", "cli-snap", url=url).stdout == "snapshot/cli-snap deleted\n"
    assert "cli-snap" in one_line_error(rollbox("get", "snapshot", "cli-snap", url=url))

    assert rollbox("delete", "sandbox", sandbox.id, url=url).stdout == f"sandbox/{sandbox.id} deleted\n"
    assert sandbox.id not in rollbox("ls", url=url).stdout
    assert "not a kind" in one_line_error(rollbox("get", "gadgets", url=url))


def test_exec_streams_output_and_exits_with_the_command_code(url: str, client: SandboxClient) -> None:
    with client.create_sandbox(template="basic") as sandbox:
        done = rollbox("exec", sandbox.id, "--", "sh", "-c", "echo out; echo err >&2; exit 5", url=url)
        assert (done.returncode, done.stdout, done.stderr) == (5, "out\n", "err\n")
        assert rollbox("exec", sandbox.id, "--", "echo $((2 + 3)) | tr 5 V", url=url).stdout == "V\n"
        options = rollbox("exec", "-e", "X=1", "-w", "/tmp", "-i", sandbox.id, "--", "echo $X; pwd; cat", url=url,
                          stdin="from stdin")
        assert options.stdout == "1\n/tmp\nfrom stdin"
        slow = rollbox("exec", "--timeout", "0.5", sandbox.id, "--", "sleep", "10", url=url)
        assert slow.returncode == 124 and "timed out after 0.5s" in slow.stderr
    assert "does not exist" in one_line_error(rollbox("exec", sandbox.id, "--", "true", url=url))


def test_background_processes_from_the_command_line(url: str, client: SandboxClient) -> None:
    with client.create_sandbox(template="basic") as sandbox:
        started = rollbox("exec", "--background", sandbox.id, "--", "echo one; echo two >&2; sleep 0.5; exit 3",
                          url=url)
        assert started.returncode == 0, started.stderr
        process = started.stdout.strip()
        long_command = "sleep 300; : " + "a-long-argument-" * 8  # wider than 80 columns, in a pipe
        sleeper = rollbox("exec", "-d", sandbox.id, "--", long_command, url=url).stdout.strip()
        table = rollbox("ps", sandbox.id, url=url).stdout
        assert table.split()[:6] == ["ID", "PID", "STATE", "TAG", "AGE", "COMMAND"]
        assert process in table and sleeper in table and "running" in table
        (row,) = [line for line in table.splitlines() if line.startswith(sleeper)]
        assert row.endswith(long_command), f"the row wrapped in a pipe:\n{table}"
        logs = rollbox("logs", sandbox.id, process, url=url)  # follows it to its end
        assert (logs.returncode, logs.stdout, logs.stderr) == (3, "one\n", "two\n")
        assert rollbox("kill", sandbox.id, sleeper, "-s", "KILL", url=url).returncode == 0
        assert rollbox("logs", sandbox.id, sleeper, url=url).returncode == 128 + 9
        listed = json.loads(rollbox("ps", sandbox.id, "-o", "json", url=url).stdout)
        assert {entry["id"]: entry["signal"] for entry in listed} == {process: 0, sleeper: 9}
        assert "does not exist" in one_line_error(rollbox("logs", sandbox.id, "nope", url=url))


def test_an_unreachable_server_or_a_bad_token_is_one_line(url: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert "cannot reach the rollbox server" in one_line_error(rollbox("ls", url=nowhere))
    assert "token" in one_line_error(rollbox("ls", url=url, token="wrong"))
    assert "KEY=VALUE" in one_line_error(rollbox("exec", "-e", "novalue", "some-id", "--", "true", url=url))


def test_bench_is_a_thin_hook(url: str) -> None:
    """`rollbox bench ARGS` runs bench/server.py with ARGS (its own tests run the benchmark itself)."""
    done = rollbox("bench", "--", "--help", url=url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: server.py") and "--quick" in done.stdout


def _cleanup(data_dir: Path) -> None:
    """Removes what a `rollbox` process left under `data_dir` (its engine's mounts, cgroups, run dir)."""
    if (data_dir / "state.db").exists():
        teardown_engine(Engine(data_dir))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serving_until_terminated(args: list[str], url: str, while_up: Callable[[], None] = lambda: None) -> str:
    """Runs `rollbox serve ARGS` until it answers at `url`, calls `while_up`, then stops the server with SIGTERM:
    what it wrote to stderr."""
    server = subprocess.Popen([str(ROLLBOX), "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 30
        while rollbox("ls", url=url).returncode != 0:
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, "rollbox serve never answered"
            time.sleep(0.2)
        while_up()
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=30)
        assert server.returncode == 0, stderr
        return stderr
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_serve_answers_until_terminated(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    tokens = tmp_path / "tokens"
    tokens.write_text("# kept out of the process list\nbob = bob-token\n")

    def tenants_by_token() -> None:
        assert rollbox("ls", url=url, token="bob-token").returncode == 0
        assert "token" in one_line_error(rollbox("ls", url=url, token="carol-token"))

    try:
        serving_until_terminated(["--data-dir", str(tmp_path / "data"), "--port", str(port), "--token",
                                  "alice=alice-token", "--tokens-file", str(tokens), "--max-sandboxes", "4"],
                                 url, tenants_by_token)
    finally:
        _cleanup(tmp_path / "data")


def test_an_open_server_on_a_socket_keeps_other_users_out_and_on_a_port_warns(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    path = tmp_path / "run" / "router.sock"  # the directory is missing: serve makes it, for its user only
    try:
        stderr = serving_until_terminated([*data, "--socket", str(path)], f"unix://{path}")
        assert "every user" not in stderr
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert not path.exists(), "the server takes its socket away when it stops"
        port = _free_port()
        stderr = serving_until_terminated([*data, "--port", str(port)], f"http://127.0.0.1:{port}")
        assert "every user of this machine may connect" in stderr and "--socket PATH" in stderr
        (tmp_path / "notes.txt").write_text("keep me")
        done = subprocess.run([str(ROLLBOX), "serve", *data, "--socket", str(tmp_path / "notes.txt" / "router.sock")],
                              capture_output=True, text=True, timeout=60)
        assert "cannot make" in one_line_error(done) and (tmp_path / "notes.txt").read_text() == "keep me"
    finally:
        _cleanup(tmp_path / "data")


def _claimed_and_warm(url: str) -> None:
    """One sandbox claimed and one warm in a pool."""
    with SandboxClient(url) as client:
        client.apply(RESOURCES)
        client.create_sandbox(template="cli-basic")
        deadline = time.monotonic() + 60
        while client.get_warmpool("cli-pool").ready < 1:
            assert time.monotonic() < deadline, "the pool never filled"
            time.sleep(0.1)


def _claims_recorded(data_dir: Path) -> int:
    with contextlib.closing(sqlite3.connect(data_dir / "node.db")) as db:
        return db.execute("SELECT count(*) FROM claims").fetchone()[0]


def test_a_stopped_server_says_what_stays_running_and_down_deletes_it(tmp_path: Path) -> None:
    """Ctrl-C or SIGTERM leaves the sandboxes running for the next server to adopt: the server says so, and how
    to delete them instead; `rollbox down` does, and refuses while a server holds the data directory."""
    data, path = tmp_path / "data", tmp_path / "router.sock"
    url = f"unix://{path}"

    def while_up() -> None:
        _claimed_and_warm(url)
        assert "stop it first" in one_line_error(rollbox("down", "--data-dir", str(data), url=url))

    try:
        stderr = serving_until_terminated(["--data-dir", str(data), "--socket", str(path)], url, while_up)
        assert "2 sandboxes stay running (1 claimed, 1 warm)" in stderr, stderr
        assert f"the next `rollbox serve --data-dir {data}` adopts them" in stderr
        assert f"`rollbox down --data-dir {data}`" in stderr and "--delete-on-exit" in stderr
        assert len([item for item in leftovers(data) if "/runtime/" in item]) == 2, "the sandboxes run on"
        done = rollbox("down", "--data-dir", str(data), url=url)
        assert done.returncode == 0, done.stderr
        assert leftovers(data) == [] and _claims_recorded(data) == 0
        assert "not a rollbox data directory" in one_line_error(rollbox("down", "--data-dir", str(tmp_path), url=url))
    finally:
        _cleanup(data)


def test_a_server_told_to_delete_on_exit_leaves_nothing_running(tmp_path: Path) -> None:
    data, path = tmp_path / "data", tmp_path / "router.sock"
    url = f"unix://{path}"
    try:
        stderr = serving_until_terminated(["--data-dir", str(data), "--socket", str(path), "--delete-on-exit"], url,
                                          lambda: _claimed_and_warm(url))
        assert "stay running" not in stderr
        assert leftovers(data) == [] and _claims_recorded(data) == 0
    finally:
        _cleanup(data)


def test_serve_refuses_an_open_network_listener_or_an_unknown_admin(tmp_path: Path) -> None:
    done = subprocess.run([str(ROLLBOX), "serve", "--data-dir", str(tmp_path / "data"), "--host", "0.0.0.0"],
                          capture_output=True, text=True, timeout=60)
    try:
        assert "without tokens" in one_line_error(done)
        lone_admin = ["--token", "alice=alice-token", "--admin", "bob"]
        done = subprocess.run([str(ROLLBOX), "serve", "--data-dir", str(tmp_path / "data"), *lone_admin],
                              capture_output=True, text=True, timeout=60)
        assert "admin 'bob' has no token" in one_line_error(done)
        (tmp_path / "tokens").write_text("alice=alice-token\nsecret-without-a-tenant\n")
        done = subprocess.run([str(ROLLBOX), "serve", "--data-dir", str(tmp_path / "data"),
                               "--tokens-file", str(tmp_path / "tokens")], capture_output=True, text=True, timeout=60)
        assert "line 2: write it as TENANT=TOKEN" in one_line_error(done) and "secret" not in done.stderr
    finally:
        _cleanup(tmp_path / "data")


def test_demo_runs_an_episode_end_to_end(tmp_path: Path) -> None:
    try:
        done = subprocess.run([str(ROLLBOX), "demo", "--data-dir", str(tmp_path / "data")], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert "exit 1, AssertionError: add(2, 3) gave -1, not 5" in lines[2]
        assert "exit 0, checks pass" in lines[4]
        assert "every sandbox deleted" in lines[-1]
    finally:
        _cleanup(tmp_path / "data")
