"""Isolated commands: a throw-away copy of the sandbox per command (runc).

An isolated command sees the sandbox's files as they are, but what it writes, the processes it
starts, its IPC objects and its network are its own and gone when it ends; it reaches neither the
sandbox's other processes nor other isolated commands. Each test attacks one of those claims.
"""

from __future__ import annotations

import threading
import time

import pytest

from rollbox.engine import Container, Engine
from rollbox.errors import InvalidRequest
from tests.support.engines import template_for


@pytest.fixture
def box(engine: Engine) -> Container:
    with engine.create(template_for("runc")) as sandbox:
        yield sandbox


def test_sees_the_sandbox_and_its_writes_vanish(box: Container) -> None:
    box.exec("echo mine > /tmp/state; echo edited > ~/notes")
    result = box.exec("cat /tmp/state ~/notes /opt/data/file; echo new > /tmp/new; echo over > ~/notes; "
                      "rm /tmp/state; mkdir ~/made; cat ~/notes", isolated=True)
    assert result.exit_code == 0 and result.stdout == "mine\nedited\nbaseline\nover\n", result
    assert box.exec("cat /tmp/state ~/notes; ls /tmp ~").stdout.split() == \
        ["mine", "edited", "/home/user:", "notes", "/tmp:", "state"]
    assert box.exec("cat /tmp/new", isolated=True).exit_code == 1, "one isolated command saw another's file"


def test_runs_as_the_sandbox_user_with_nothing_more(box: Container) -> None:
    result = box.exec("id -u; id -g; stat -c '%U %G' /etc/passwd ~; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status",
                      isolated=True)
    assert result.stdout.split("\n")[:4] == ["1000", "1000", "root root", "user user"], result
    assert all(line.endswith("0000000000000000") for line in result.stdout.splitlines()[4:]), result
    assert box.exec("id -u", isolated=True, user="root").stdout == "0\n"


def test_exit_status_signals_output_and_stdin(box: Container) -> None:
    assert box.exec("exit 3", isolated=True).exit_code == 3
    killed = box.exec("kill -TERM $$", isolated=True)
    assert (killed.exit_code, killed.signal) == (143, 15), killed
    echoed = box.exec(["cat"], isolated=True, stdin="in\n")
    assert echoed.stdout == "in\n"
    missing = box.exec(["no-such-program"], isolated=True)
    assert missing.exit_code == 127 and "no-such-program" in missing.stderr
    capped = box.exec("head -c 100000 /dev/zero", isolated=True, output_limit=1000)
    assert len(capped.stdout) == 1000 and capped.stdout_truncated


def test_processes_end_with_the_command_and_cannot_reach_out(box: Container) -> None:
    box.exec("sleep 300 > /dev/null 2>&1 &")
    outside = box.exec("pgrep -x sleep").stdout.split()
    assert len(outside) == 1
    # The sandbox's sleep is visible in /proc (shared with the sandbox) but not addressable: the isolated
    # command has its own pid namespace, where that pid is nobody or someone else.
    attempt = box.exec(f"kill -9 {outside[0]}; kill -9 -1; echo $$", isolated=True)
    assert box.exec("pgrep -x sleep").stdout.split() == outside, attempt
    assert attempt.stdout.split()[-1] == "2", "an isolated command should be its pid namespace's second process"
    # A background process of an isolated command does not outlive it.
    box.exec("setsid sleep 301 > /dev/null 2>&1 & echo started", isolated=True)
    deadline = time.monotonic() + 5
    while "301" in box.exec("ps -eo args").stdout and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "301" not in box.exec("ps -eo args").stdout


def test_timeout_kills_the_isolated_tree(box: Container) -> None:
    result = box.exec("sleep 302 & sleep 303", isolated=True, timeout=0.5)
    assert result.timed_out and result.exit_code is None
    assert "30" not in box.exec("ps -eo args | grep 'sleep 30'| grep -v grep").stdout


def test_concurrent_isolated_commands_are_apart(box: Container) -> None:
    """Two isolated commands at once: neither sees the other's files, shared memory or loopback server."""
    results: dict[str, object] = {}

    def first() -> None:
        results["first"] = box.exec(
            "echo first-file > /tmp/one; echo first-shm > /dev/shm/one; python3 -m http.server 8765 --bind 127.0.0.1 "
            "> /dev/null 2>&1 & sleep 2; cat /tmp/two /dev/shm/two 2>&1; true", isolated=True, timeout=30)

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(1)
    second = box.exec("echo second-file > /tmp/two; echo second-shm > /dev/shm/two; cat /tmp/one /dev/shm/one 2>&1; "
                      "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8765', timeout=2)\" "
                      "> /dev/null 2>&1; echo fetch=$?", isolated=True, timeout=30)
    thread.join()
    assert "first-" not in second.stdout and second.stdout.count("No such file") == 2, second
    assert "fetch=1" in second.stdout, "an isolated command reached another's loopback server"
    assert "second-" not in str(results["first"]) and str(results["first"]).count("No such file") == 2, results


def test_network_is_loopback_only(box: Container) -> None:
    result = box.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; "
                      "python3 -c \"import socket; s = socket.socket(); s.settimeout(2); "
                      "s.connect(('10.0.0.1', 80))\" 2>&1 | tail -1", isolated=True, timeout=30)
    assert result.stdout.splitlines()[0] == "lo" and "unreachable" in result.stdout, result


def test_isolated_commands_cannot_make_namespaces_or_mounts(box: Container) -> None:
    """The agent needs unshare and mount to isolate; the filter it puts on every command takes them away."""
    for user in (None, "root"):
        tools = box.exec("unshare -Ur true; unshare -m true; mount -t tmpfs none /mnt; umount -l /proc; "
                         "python3 -c 'import os; os.unshare(os.CLONE_NEWUSER)' 2>/dev/null; echo end",
                         isolated=True, user=user)
        assert tools.stdout == "end\n", tools
        assert "Operation not permitted" in tools.stderr, tools


def test_gvisor_sandboxes_refuse_isolation(engine: Engine) -> None:
    with engine.create(template_for("runsc")) as sandbox, pytest.raises(InvalidRequest, match="runc"):
        sandbox.exec("true", isolated=True)
