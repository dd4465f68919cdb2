"""Live fork, snapshots with memory and standby through a real server and the SDK (docs/checkpoints.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from rollbox.client import SandboxClient
from tests.support.live import ask, start_memory_server
from tests.support.servers import ADMINS, TOKENS, router

TEMPLATES = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: live}
spec: {runtime: runsc}
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: files-only}
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:
    with router(tmp_path_factory.mktemp("live"), TOKENS, ADMINS) as address, \
            SandboxClient(address, token=TOKENS["alice"]) as alice:
        alice.apply(TEMPLATES)
        yield alice


def test_a_live_fork_through_the_api_answers_memory_and_carries_the_parents_state(client: SandboxClient) -> None:
    with client.create_sandbox(template="live") as parent:
        start_memory_server(parent)
        secret = ask(parent, "secret")
        children = parent.fork(2)
        try:
            assert all(child.info.memory and child.info.parent == parent.id for child in children)
            assert [ask(child, "secret") for child in children] == [secret, secret]
            assert ask(parent, "secret") == secret
        finally:
            for child in children:
                child.delete()
    with client.create_sandbox(template="files-only") as runc:
        [child] = runc.fork(1)
        with child:
            assert child.info.memory is False


def test_snapshot_with_memory_is_listed_with_its_size_and_claimed_running(client: SandboxClient) -> None:
    with client.create_sandbox(template="live") as source:
        start_memory_server(source)
        secret = ask(source, "secret")
        info = source.snapshot("warm-repl")
        assert info.memory and info.size
        try:
            [listed] = [s for s in client.list_snapshots() if s.name == "warm-repl"]
            assert listed.memory and listed.size == info.size
            with client.create_sandbox(snapshot="warm-repl") as claimed:
                assert claimed.info.memory and ask(claimed, "secret") == secret
        finally:
            client.delete_snapshot("warm-repl")


def test_pause_is_a_standby_that_resume_and_the_idle_policy_restore(client: SandboxClient) -> None:
    with client.create_sandbox(template="live") as box:
        start_memory_server(box)
        pid = ask(box, "pid")
        assert box.pause().info.state == "paused"
        assert box.resume().info.state == "running" and ask(box, "pid") == pid
    with client.create_sandbox(template="live", idle_pause_after=0.5) as idle:
        start_memory_server(idle)
        pid = ask(idle, "pid")
        deadline = time.monotonic() + 30
        while idle.refresh().info.state != "paused":
            assert time.monotonic() < deadline, "the idle policy never put the sandbox in standby"
            time.sleep(0.2)
        assert ask(idle, "pid") == pid  # its next call restores it, under the same id
        assert idle.refresh().info.state == "running"


def test_a_fork_while_a_process_is_followed_keeps_the_stream_and_the_parent(client: SandboxClient) -> None:
    """The agent lets go of a followed process's connection while the host checkpoints (gVisor cannot save it); the
    stream follows on from where it was, losing and repeating nothing, and the fork succeeds."""
    with client.create_sandbox(template="live") as parent:
        counter = parent.commands.run("for i in $(seq 1 30); do echo $i; sleep 0.1; done", background=True)
        lines: list[str] = []
        follower = threading.Thread(target=lambda: lines.append(counter.wait().stdout))
        follower.start()
        time.sleep(0.5)
        children = parent.fork(2)
        try:
            follower.join(timeout=60)
            assert not follower.is_alive(), "the stream never ended"
            assert lines == ["".join(f"{i}\n" for i in range(1, 31))]
            assert parent.commands.run("echo still here").stdout == "still here\n"
            assert all(child.commands.run("true").exit_code == 0 for child in children)
        finally:
            for child in children:
                child.delete()
