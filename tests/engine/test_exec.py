"""Exec through the agent: shell strings and argv, stdin, env, cwd, user, timeouts, caps, streaming."""

from __future__ import annotations

import asyncio
import time

import pytest

from rollbox.engine import Container
from rollbox.errors import InvalidRequest
from tests.support.cluster import wait_for


def test_shell_and_argv(sandbox: Container) -> None:
    result = sandbox.exec("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert sandbox.exec(["printf", "%s|", "a b", "c"]).stdout == "a b|c|"


def test_default_identity_and_environment(sandbox: Container) -> None:
    result = sandbox.exec("id -u; id -g; pwd; echo $HOME; hostname; echo $TZ")
    assert result.stdout.split() == ["1000", "1000", "/home/user", "/home/user", "sandbox", "UTC"]


def test_python_is_python3(sandbox: Container) -> None:
    """Agent scripts call `python`: the host base runs python3 for it, as a shell word and as argv[0]."""
    result = sandbox.exec("command -v python; python -c 'import sys; print(sys.version_info[0])'")
    assert (result.exit_code, result.stdout.split()) == (0, ["/usr/local/bin/python", "3"]), result.stderr
    assert sandbox.exec(["python", "-V"]).stdout == sandbox.exec(["python3", "-V"]).stdout


def test_stdin_env_cwd_user(sandbox: Container) -> None:
    assert sandbox.exec("tr a-z A-Z", stdin="hello").stdout == "HELLO"
    assert sandbox.exec("echo $GREETING", env={"GREETING": "hi"}).stdout == "hi\n"
    assert sandbox.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sandbox.exec("id -u", user="root").stdout == "0\n"


def test_large_stdin_and_output(sandbox: Container) -> None:
    data = "x" * 3_000_000
    result = sandbox.exec("wc -c", stdin=data, output_limit=10_000_000)
    assert result.stdout.strip() == str(len(data))
    result = sandbox.exec("cat", stdin=data, output_limit=10_000_000)
    assert len(result.stdout) == len(data)


def test_commands_have_no_capabilities_even_as_root(sandbox: Container) -> None:
    for user in (None, "root"):
        status = sandbox.exec("grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status", user=user).stdout
        assert all(line.split()[1] == "0000000000000000" for line in status.splitlines()), status
        no_new_privs = "import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"  # PR_GET_NO_NEW_PRIVS
        assert sandbox.exec(["python3", "-c", no_new_privs], user=user).stdout == "1\n"


def test_missing_command_and_cwd(sandbox: Container) -> None:
    result = sandbox.exec(["no-such-command"])
    assert result.exit_code == 127 and "no-such-command" in result.stderr
    result = sandbox.exec(["true"], cwd="/no/such/dir")
    assert result.exit_code == 126 and "/no/such/dir" in result.stderr
    with pytest.raises(InvalidRequest):
        sandbox.exec([])


def test_timeout_kills_the_whole_tree_and_keeps_output(sandbox: Container) -> None:
    started = time.monotonic()
    result = sandbox.exec("echo before; (setsid sleep 300 &); sleep 300 & sleep 300", timeout=1)
    assert result.timed_out and result.exit_code is None
    assert result.stdout == "before\n"
    assert time.monotonic() - started < 30, "the timeout, not the 300 s sleeps, ended the command"
    assert sandbox.exec("pgrep -x sleep || echo none").stdout.strip() == "none"


def test_output_cap_sets_truncated(sandbox: Container) -> None:
    result = sandbox.exec("head -c 100000 /dev/zero | tr '\\0' a; echo tail >&2", output_limit=1000)
    assert len(result.stdout) == 1000 and result.stdout_truncated
    assert result.stderr == "tail\n" and not result.stderr_truncated


def test_output_streams_as_produced(sandbox: Container) -> None:
    seen: list[tuple[float, str]] = []
    sandbox.exec("echo one; sleep 1; echo two", on_stdout=lambda text: seen.append((time.monotonic(), text)))
    assert [text for _, text in seen] == ["one\n", "two\n"]
    assert seen[1][0] - seen[0][0] > 0.5, "the first line must arrive while the command still sleeps"


def test_background_process_lives_between_commands(sandbox: Container) -> None:
    start = sandbox.exec("python3 -m http.server 8000 --bind 127.0.0.1 >/tmp/server.log 2>&1 & echo started")
    assert start.stdout == "started\n"
    fetch = ("python3 -c \"import urllib.request,time\n"
             "for _ in range(100):\n"
             "  try: print(urllib.request.urlopen('http://127.0.0.1:8000/').status); break\n"
             "  except OSError: time.sleep(0.05)\"")
    assert sandbox.exec(fetch, timeout=20).stdout.strip() == "200"


def test_background_writer_does_not_block_or_die(sandbox: Container) -> None:
    """A background job that keeps writing to the command's stdout must neither hold the command
    open nor die of SIGPIPE once the command has returned."""
    result = sandbox.exec("(while true; do echo tick; echo tick >> /tmp/ticks; sleep 0.05; done) & echo launched",
                          timeout=5)
    assert result.exit_code == 0 and "launched" in result.stdout
    time.sleep(0.3)
    first = sandbox.files.read("/tmp/ticks").count(b"tick")
    wait_for(lambda: sandbox.files.read("/tmp/ticks").count(b"tick") > first, "the writer goes on ticking", 10)


def test_concurrent_execs(sandbox: Container) -> None:
    """Twenty commands wait at a barrier for each other: they finish only if all run at once."""
    barrier = "touch /tmp/arrived.$N; while [ $(ls /tmp | grep -c '^arrived') -lt 20 ]; do sleep 0.05; done; echo $N"

    async def many() -> list[str]:
        results = await asyncio.gather(*(sandbox.exec_async(barrier, env={"N": str(n)}, timeout=60)
                                         for n in range(20)))
        assert not any(result.timed_out for result in results), "the commands did not run concurrently"
        return [r.stdout.strip() for r in results]

    assert sorted(asyncio.run(many()), key=int) == [str(n) for n in range(20)]


def test_a_same_size_fix_in_the_same_second_is_what_runs(sandbox: Container) -> None:
    """Python trusts a .pyc whose source has the same mtime second and size: sandboxes write none."""
    sandbox.files.write("calc.py", "def add(a, b):\n    return a - b\n")
    check = ["python3", "-c", "import calc; print(calc.add(2, 3))"]
    assert sandbox.exec(check).stdout == "-1\n"
    sandbox.files.write("calc.py", "def add(a, b):\n    return a + b\n")
    assert sandbox.exec(check).stdout == "5\n"
