"""Processes and memory that last (gVisor): live fork, snapshots with memory, standby on disk, and their bounds."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from rollbox.engine import Container, Engine
from rollbox.errors import CapacityExceeded, RestoreFailed, RuntimeUnavailable, SandboxNotRunning
from rollbox.spec import Limits
from tests.support.cluster import wait_for
from tests.support.engines import template_for
from tests.support.live import ASK, MEMORY_SERVER, PORT, ask, start_memory_server

GVISOR = template_for("runsc")


@pytest.fixture
def holder(engine: Engine) -> Iterator[Container]:
    """A gVisor sandbox whose background Python process holds a random secret in memory only."""
    with engine.create(GVISOR) as box:
        start_memory_server(box)
        yield box


def images(engine: Engine) -> set[str]:
    return set(os.listdir(engine.checkpoints.root))


def test_live_fork_children_continue_the_parents_processes_and_diverge(engine: Engine, holder: Container) -> None:
    secret, parent_pid = ask(holder, "secret"), ask(holder, "pid")
    holder.exec("echo parent > /tmp/f")
    before = float(holder.exec("date +%s.%N").stdout)
    assert engine.carries_memory(holder.id)
    children = holder.fork(2)
    try:
        for child in children:
            assert ask(child, "secret") == secret and ask(child, "pid") == parent_pid
            assert float(child.exec("date +%s.%N").stdout) >= before  # no clock runs backwards
        assert ask(holder, "secret") == secret and ask(holder, "pid") == parent_pid  # the parent goes on
        children[0].exec("echo child > /tmp/f; pkill -f " + MEMORY_SERVER)
        ask(children[1], "set:x")
        assert ask(children[1], "secret") == "x" and ask(holder, "secret") == secret
        assert [c.exec("cat /tmp/f").stdout for c in (holder, *children)] == ["parent\n", "child\n", "parent\n"]
        assert holder.exec("pgrep -f " + MEMORY_SERVER).exit_code == 0  # a child's kill stays in the child
        assert all(c.info.parent == holder.id for c in children)
    finally:
        for child in children:
            child.delete()
    assert not images(engine)  # a fork keeps no image


def test_runc_fork_keeps_the_file_only_fork(engine: Engine) -> None:
    with engine.create(template_for("runc")) as box:
        assert not engine.carries_memory(box.id)


def test_a_claim_from_a_snapshot_with_memory_runs_on_where_it_was_taken(engine: Engine, holder: Container) -> None:
    secret = ask(holder, "secret")
    info = holder.snapshot("live-snap")
    try:
        assert info.memory and info.size and info.size > 0
        listed = {s.name: s for s in engine.snapshots()}["live-snap"]
        assert listed.memory and listed.size == info.size
        with engine.create(snapshot="live-snap") as claimed:
            assert ask(claimed, "secret") == secret
            ask(claimed, "set:y")
            claimed.reset()  # back to the snapshot: its processes and memory again
            assert ask(claimed, "secret") == secret
        assert ask(holder, "secret") == secret
    finally:
        engine.delete_snapshot("live-snap")
    assert not images(engine)  # deleted with its image


def test_standby_frees_memory_and_the_next_call_resumes_it(engine: Engine, holder: Container) -> None:
    secret = ask(holder, "secret")
    running = holder.stats().memory_bytes
    holder.pause()
    assert holder.info.state == "standby" and len(images(engine)) == 1
    assert holder.stats().memory_bytes <= running * 0.05
    assert ask(holder, "secret") == secret  # the next command resumes it, same id
    assert holder.info.state == "running" and not images(engine)
    holder.exec("id -u", user="root")


def test_a_corrupt_or_missing_image_fails_clearly_and_leaves_nothing(engine: Engine, holder: Container) -> None:
    holder.snapshot("broken")
    try:
        image = engine.store.snapshot("broken")[1].checkpoint  # type: ignore[index]
        (engine.checkpoints.path(image) / "checkpoint.img").write_bytes(b"not a checkpoint")
        known = {info.id for info in engine.list()}
        with pytest.raises(RestoreFailed, match="could not be restored"):
            engine.create(snapshot="broken")
        engine.checkpoints.remove(image)
        with pytest.raises(RestoreFailed, match="missing"):
            engine.create(snapshot="broken")
        assert {info.id for info in engine.list()} == known
        assert not [p for p in engine.launcher.bundle_dir.iterdir() if p.name not in known]
    finally:
        engine.delete_snapshot("broken")


def test_images_count_against_the_disk_limit_and_the_budget(engine: Engine, holder: Container) -> None:
    secret = ask(holder, "secret")
    budget, engine.checkpoints.budget = engine.checkpoints.budget, 0
    try:
        with pytest.raises(CapacityExceeded, match="budget"):
            holder.pause()
    finally:
        engine.checkpoints.budget = budget
    assert holder.info.state == "running" and ask(holder, "secret") == secret and not images(engine)
    with engine.create(GVISOR, limits=Limits(disk=256 * 1024)) as small:
        start_memory_server(small)
        with pytest.raises(CapacityExceeded, match="disk limit"):
            small.snapshot("too-big")
        assert ask(small, "secret") and not engine.snapshots()
    assert not images(engine)


def test_standby_survives_recovery_which_removes_orphan_images(engine: Engine, holder: Container) -> None:
    pid = ask(holder, "pid")
    holder.pause()
    saved = images(engine)
    (engine.checkpoints.root / "c-orphan").mkdir()  # what a save cut short by a crash leaves
    engine.recover()
    assert images(engine) == saved and holder.info.state == "standby"
    assert ask(holder, "pid") == pid


def test_a_save_that_fails_loses_the_processes_not_the_sandbox(engine: Engine, holder: Container) -> None:
    """A command in flight holds a connection from the host, which runsc cannot save: the fork fails, and the
    sandbox is started again over its files, leaving no image."""
    holder.exec("echo kept > /tmp/f")
    outcome: list[BaseException] = []

    def in_flight() -> None:
        try:
            holder.exec("sleep 3")
        except SandboxNotRunning as error:
            outcome.append(error)

    running = threading.Thread(target=in_flight)
    running.start()
    wait_for(lambda: holder.exec("pgrep -x sleep").ok, "the command in flight started", 30)
    with pytest.raises(RuntimeUnavailable, match="started again over its files"):
        holder.fork(1)
    running.join()
    assert outcome, "the command in flight went with the processes, with a clear error"
    assert holder.exec("cat /tmp/f").stdout == "kept\n"
    assert holder.exec(ASK.format(port=PORT, what="pid")).exit_code != 0  # its processes are gone
    assert not images(engine)


@pytest.mark.parametrize("operation", ["fork", "snapshot"])
def test_a_restore_that_fails_loses_the_processes_not_the_sandbox(engine: Engine, holder: Container,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  operation: str) -> None:
    """The saved sandbox is restored from its image after a fork or a snapshot; should runsc refuse that image, the
    sandbox is started again over its files under its id, and a fork leaves no child and no image behind."""
    holder.exec("echo kept > /tmp/f")
    known = {info.id for info in engine.list()}
    start = engine.launcher.start

    def refuse_the_sources_image(record, network, image=None):  # type: ignore[no-untyped-def]
        if record.id == holder.id and image is not None:
            raise RuntimeUnavailable("runsc restore: refused (a test's stand-in for a failed restore)")
        return start(record, network, image)

    monkeypatch.setattr(engine.launcher, "start", refuse_the_sources_image)
    with pytest.raises(RestoreFailed, match="started again over its files"):
        holder.fork(2) if operation == "fork" else holder.snapshot("failed-source")
    monkeypatch.undo()
    assert holder.info.state == "running"
    assert holder.exec("cat /tmp/f").stdout == "kept\n"
    assert holder.exec(ASK.format(port=PORT, what="pid")).exit_code != 0  # its processes are gone
    assert {info.id for info in engine.list()} == known
    if operation == "fork":
        assert not images(engine)
    else:
        engine.delete_snapshot("failed-source")
    assert not [p for p in engine.launcher.bundle_dir.iterdir() if p.name not in known]
