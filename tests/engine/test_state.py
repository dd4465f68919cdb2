"""State operations: reset, fork, snapshot, pause/resume, shutdown_after."""

from __future__ import annotations

import os
import resource
import time

import pytest

from rollbox.engine import Container, Engine
from rollbox.engine.layering import FORK_COPY_BYTES
from rollbox.errors import Conflict, InvalidRequest, RollboxError, SandboxNotFound, SandboxNotRunning, SnapshotNotFound
from rollbox.spec import Limits
from tests.support.cluster import wait_for
from tests.support.engines import template_for


def test_reset_returns_to_the_template_baseline(sandbox: Container) -> None:
    sandbox.exec("echo dirty > /opt/data/file; rm -rf /home/user; touch /tmp/new; sleep 300 &")
    sandbox.reset()
    result = sandbox.exec("cat /opt/data/file; ls -d /home/user; ls /tmp; pgrep sleep || echo no-sleep")
    assert result.stdout == "baseline\n/home/user\nno-sleep\n"


def test_fork_children_start_from_parent_files_and_are_isolated(engine: Engine, sandbox: Container) -> None:
    sandbox.exec("echo parent-state > state.txt; head -c 1048576 /dev/urandom > blob")
    checksum = sandbox.exec("md5sum blob").stdout
    children = sandbox.fork(3)
    try:
        assert len({child.id for child in children} | {sandbox.id}) == 4
        for index, child in enumerate(children):
            assert child.exec("cat state.txt; md5sum blob").stdout == "parent-state\n" + checksum
            child.exec(f"echo child-{index} > state.txt")
        assert sandbox.exec("cat state.txt").stdout == "parent-state\n"
        assert [c.exec("cat state.txt").stdout for c in children] == [f"child-{i}\n" for i in range(3)]
        sandbox.exec("echo parent-later > later.txt")
        assert all(not c.files.exists("later.txt") for c in children)
        assert children[0].info.parent == sandbox.id
        children[0].reset()
        assert children[0].exec("cat state.txt 2>&1; cat /opt/data/file").stdout.endswith("baseline\n")
        assert "No such file" in children[0].exec("cat state.txt").stderr
    finally:
        for child in children:
            child.delete()


def test_a_fork_of_a_small_parent_keeps_it_running(sandbox: Container) -> None:
    """Its files are copied, not frozen in place: the parent's processes carry on; the children's start afresh,
    and whiteouts (a deleted file of the template) and opaque directories (a replaced one) carry over."""
    sandbox.exec("sleep 300 > /dev/null 2>&1 &")
    sandbox.exec("rm -rf /opt/data && mkdir /opt/data && echo new > /opt/data/other && rm /etc/hostname",
                 user="root")
    before = sandbox.exec("pgrep -x sleep").stdout
    (child,) = sandbox.fork(1)
    try:
        assert sandbox.exec("pgrep -x sleep").stdout == before != ""
        carried = before if sandbox.engine.carries_memory(sandbox.id) else "none\n"  # gVisor: a live fork
        assert child.exec("pgrep -x sleep || echo none; ls /opt/data; ls /etc/hostname 2>&1").stdout == \
            carried + "other\nls: cannot access '/etc/hostname': No such file or directory\n"
    finally:
        child.delete()


def test_repeated_forks_stack_layers_and_clean_up(engine: Engine, sandbox: Container) -> None:
    """Parents past FORK_COPY_BYTES freeze their upper in place: layers stack, and go when nothing uses them."""
    for generation in range(5):
        sandbox.exec(f"echo {generation} > gen{generation}; head -c {FORK_COPY_BYTES + 2**20} /dev/zero > big")
        (child,) = sandbox.fork(1)
        assert child.exec("cat gen*").stdout.split() == [str(n) for n in range(generation + 1)]
        child.delete()
    before = {layer for layer in engine.layers.all_ids() if layer.startswith("u-")}
    sandbox.delete()
    after = {layer for layer in engine.layers.all_ids() if layer.startswith("u-")}
    assert len(before - after) >= 6, "the frozen uppers of a deleted sandbox must go with it"


def test_fork_count_is_bounded(sandbox: Container) -> None:
    with pytest.raises(InvalidRequest):
        sandbox.fork(0)


@pytest.mark.parametrize("breakage", ["a directory", "a link to a directory"])
def test_fork_and_snapshot_refuse_a_root_the_runtime_could_not_start_and_lose_nothing(
        engine: Engine, sandbox: Container, breakage: str) -> None:
    """The tenant may remove /etc/passwd and put a directory there (the files API acts as root in the sandbox).
    The OCI runtime then cannot start a container over those files: fork and snapshot, which start some, are
    refused before the container stops, and it runs on with everything it had."""
    sandbox.exec("echo kept > note.txt")
    sandbox.files.remove("/etc/passwd")
    if breakage == "a directory":
        sandbox.files.mkdir("/etc/passwd")
    else:
        sandbox.files.symlink("/etc/passwd", "/var")
    for operation in (lambda: sandbox.fork(1), lambda: sandbox.snapshot("broken-accounts")):
        with pytest.raises(Conflict, match=r"/etc/passwd is not a file.*make it a file again") as caught:
            operation()
        assert sandbox.id not in str(caught.value), "the message names no container id"
    assert sandbox.exec("cat note.txt").stdout == "kept\n", "the container runs on, with its files"
    assert sandbox.exec("id -u", user="root").stdout == "0\n", "no accounts to read is no failure (the fuzz's 500)"
    with pytest.raises(InvalidRequest, match="does not exist in the sandbox's /etc/passwd"):
        sandbox.exec("true", user="someone")
    assert len(engine.list()) == len({info.id for info in engine.list()})
    sandbox.files.remove("/etc/passwd")
    sandbox.files.write("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
    [child] = sandbox.fork(1)
    with child:
        assert child.exec("cat note.txt").stdout == "kept\n"


def test_a_container_that_fails_to_start_again_stays_stopped_until_a_reset(engine: Engine, sandbox: Container
                                                                          ) -> None:
    """A snapshot stops the container and starts it again over its frozen files (restores it, under gVisor). When
    that start fails (here the exec agent's binary is missing from the host), the container is kept, stopped: its
    calls say so, and a reset starts it afresh from its template."""
    sandbox.exec("echo written > note.txt")
    agent = engine.launcher.agent
    hidden = agent.with_name(agent.name + ".hidden")
    agent.rename(hidden)
    try:
        with pytest.raises(RollboxError):
            sandbox.snapshot("start-fails")
    finally:
        hidden.rename(agent)
    assert sandbox.info.state == "stopped" and engine.stopped(sandbox.id)
    with pytest.raises(SandboxNotRunning, match=r"is stopped .*reset it") as stopped:
        sandbox.exec("true")
    assert stopped.value.container_id == sandbox.id
    with pytest.raises(SandboxNotRunning):
        sandbox.files.read("note.txt")
    sandbox.reset()
    assert sandbox.info.state == "running" and not engine.stopped(sandbox.id)
    assert sandbox.exec("cat note.txt").exit_code != 0, "a reset goes back to the template"
    assert sandbox.exec("echo back").stdout == "back\n"
    engine.delete_snapshot("start-fails")  # taken before the start failed


def test_snapshot_is_a_start_point_for_new_sandboxes(engine: Engine, sandbox: Container) -> None:
    sandbox.exec("echo saved > note.txt")
    info = sandbox.snapshot("after-note")
    assert info.source == sandbox.id
    sandbox.exec("echo after > note.txt")
    with engine.create(snapshot="after-note") as restored:
        assert restored.exec("cat note.txt").stdout == "saved\n"
        restored.exec("echo changed > note.txt")
        restored.reset()
        assert restored.exec("cat note.txt").stdout == "saved\n", "reset goes back to the snapshot"
        engine.delete_snapshot("after-note")
        assert restored.exec("cat note.txt").stdout == "saved\n", "layers outlive the snapshot's name"
    with pytest.raises(SnapshotNotFound):
        engine.create(snapshot="after-note")


def test_pause_stops_cpu_and_keeps_state(engine: Engine, sandbox: Container) -> None:
    sandbox.exec("echo kept > kept.txt; (while :; do :; done) &")
    sandbox.pause()
    try:
        used = sandbox.stats().cpu_seconds
        time.sleep(0.5)
        assert sandbox.stats().cpu_seconds - used < 0.01
        standby = engine.carries_memory(sandbox.id)  # gVisor: saved to disk, and its next command resumes it
        assert sandbox.info.state == ("standby" if standby else "paused")
        if not standby:
            with pytest.raises(SandboxNotRunning):
                sandbox.exec("true")
    finally:
        sandbox.resume()
    assert sandbox.exec("cat kept.txt").stdout == "kept\n"
    wait_for(lambda: sandbox.stats().cpu_seconds - used > 0.05, "the busy loop runs again after resume", 10)


def test_a_restart_boots_again_and_a_freeze_does_not(engine: Engine, sandbox: Container) -> None:
    """Each start has a boot id of its own, as a machine booted again has: a pause that keeps memory keeps it."""
    boot_id = "cat /proc/sys/kernel/random/boot_id"
    if not engine.runtime(sandbox.info.runtime).own_boot_id:
        pytest.skip("this gVisor's /proc has no boot id")
    first = sandbox.exec(boot_id).stdout
    sandbox.pause()
    sandbox.resume()
    assert sandbox.exec(boot_id).stdout == first
    engine.pause(sandbox.id, memory=False)
    sandbox.resume()
    again = sandbox.exec(boot_id).stdout
    assert again != first and len(again.strip()) == 36


def test_shutdown_after_deletes_the_container(engine: Engine) -> None:
    box = engine.create("basic", limits=Limits(shutdown_after=1))
    assert box.exec("true").exit_code == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            box.info  # noqa: B018
        except SandboxNotFound:
            return
        time.sleep(0.2)
    pytest.fail("the sandbox outlived its shutdown_after")


def test_stats(sandbox: Container) -> None:
    sandbox.exec("head -c 5000000 /dev/zero > zeros")
    stats = sandbox.stats()
    assert stats.disk_bytes >= 5_000_000 and stats.memory_bytes > 0 and stats.pids >= 1


def test_concurrent_forks_and_deletes_lose_no_layer(engine: Engine) -> None:
    """Fork, delete and create racing in several threads: clean-up must never take a layer in use."""
    from concurrent.futures import ThreadPoolExecutor

    def episode(number: int) -> list[str]:
        with engine.create("basic") as parent:
            parent.exec(f"echo {number} > n")
            children = parent.fork(4)
        outputs = [child.exec("cat n").stdout for child in children]
        for child in children:
            child.delete()
        return outputs

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(episode, range(9)))
    assert results == [[f"{n}\n"] * 4 for n in range(9)]


def test_a_process_with_thousands_of_descriptors_still_deletes_and_resets(engine: Engine, runtime: str) -> None:
    """A node holds a descriptor per warm sandbox: past select()'s limit of 1024, deletes must still work."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        box = engine.create(template_for(runtime))
        box.reset()
        assert box.exec("echo up").stdout == "up\n"
        box.delete()
        with pytest.raises(SandboxNotFound):
            engine.info(box.id)
    finally:
        for fd in held:
            os.close(fd)
