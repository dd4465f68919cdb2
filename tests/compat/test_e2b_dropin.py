"""E2B's SDK, unmodified, on what its own users and tests rely on beyond the basics (docs/compat-e2b.md): files
answered as E2B's daemon answers them (absolute paths, owners, metadata, path order, signed URLs, /proc), commands
(a relative working directory, a broken last character, a sandbox killed mid-command), lists, metrics, snapshot
names, pause modes, auto-pause on timeout, watches, ports by `get_host`, and network settings.
"""

from __future__ import annotations

import datetime
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import anyio
import httpx
import pytest
from e2b import (
    AsyncSandbox,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
)

from rollbox.client import SandboxClient
from rollbox.engine import Engine
from tests.support.cluster import Process, wait_for
from tests.support.engines import teardown_engine
from tests.support.port_server import PORT_SERVER
from tests.support.servers import TEMPLATE, TOKENS

POOL = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {name: e2b-dropin}
spec:
  sandboxTemplateRef: {name: basic}
  replicas: 2
"""


@pytest.fixture(scope="module", autouse=True)
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("e2b-dropin")
    tokens = [arg for tenant, token in TOKENS.items() for arg in ("--token", f"{tenant}={token}")]
    process = Process(["serve", "--data-dir", str(root / "data"), *tokens, "--admin", "alice", "--delete-on-exit"],
                      root / "serve.log")
    saved = dict(os.environ)
    try:
        process.start()
        with SandboxClient(process.url, token=TOKENS["alice"]) as client:
            client.apply(TEMPLATE + "---\n" + POOL)
            wait_for(lambda: client.get_warmpool("e2b-dropin").ready == 2, "the warm pool fills")
        os.environ.update(E2B_API_URL=process.url, E2B_SANDBOX_URL=process.url, E2B_API_KEY=TOKENS["alice"])
        yield process
    finally:
        os.environ.clear()
        os.environ.update(saved)
        process.stop()
        teardown_engine(Engine(root / "data"))


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox.create(template="e2b-dropin", timeout=120)
    yield box
    box.kill()


def test_files_as_e2bs_daemon_answers_them(sandbox: Sandbox) -> None:
    assert sandbox.files.write("notes.txt", "n").path == "/home/user/notes.txt"
    assert [info.path for info in sandbox.files.write_files([{"path": "a/one.txt", "data": "1"},
                                                             {"path": "/tmp/two.txt", "data": b"2"}])] == [
        "/home/user/a/one.txt", "/tmp/two.txt"]
    info = sandbox.files.get_info("notes.txt")
    assert (info.owner, info.group, info.permissions, info.path) == ("user", "user", "-rw-r--r--",
                                                                     "/home/user/notes.txt")
    for directory in ("t", "t/b", "t/a", "t/b/y", "t/a/x"):
        sandbox.files.make_dir(directory)
    sandbox.files.write("t/z.txt", "z")
    assert [entry.path.removeprefix("/home/user/t/") for entry in sandbox.files.list("t", depth=2)] == [
        "a", "a/x", "b", "b/y", "z.txt"]  # a directory, then what it holds, as E2B walks
    sandbox.files.remove("not-there")  # no error, as in E2B
    sandbox.commands.run("ln -s z.txt link", cwd="t")  # a relative working directory is taken from home
    link = sandbox.files.get_info("t/link")
    assert (link.type, link.symlink_target, link.size) == (FileType.SYMLINK, "/home/user/t/z.txt", 1)


def test_file_metadata_lives_in_extended_attributes(sandbox: Sandbox) -> None:
    written = sandbox.files.write("meta.txt", "m", metadata={"Author": "ada", "stage": "draft"})
    assert written.metadata == {"author": "ada", "stage": "draft"}  # keys lowercased, as E2B's daemon does
    assert sandbox.files.get_info("meta.txt").metadata == {"author": "ada", "stage": "draft"}
    assert sandbox.files.rename("meta.txt", "moved.txt").metadata == {"author": "ada", "stage": "draft"}
    listed = next(entry for entry in sandbox.files.list(".") if entry.name == "moved.txt")
    assert listed.metadata == {"author": "ada", "stage": "draft"}
    assert sandbox.files.write("moved.txt", "again").metadata is None  # an overwrite drops the old ones
    sandbox.commands.run("python3 -c \"import os; os.setxattr('/home/user/moved.txt', 'user.e2b.set', b'inside')\"")
    assert sandbox.files.get_info("moved.txt").metadata == {"set": "inside"}
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write("bad.txt", "x", metadata={"bad key": "v"})


def test_signed_urls_open_one_file_without_a_token(sandbox: Sandbox) -> None:
    sandbox.files.write("signed.txt", "for the holder")
    with urllib.request.urlopen(sandbox.download_url("signed.txt")) as answer:
        assert answer.read() == b"for the holder"
    with urllib.request.urlopen(sandbox.download_url("signed.txt", use_signature_expiration=60)) as answer:
        assert answer.read() == b"for the holder"
    with pytest.raises(urllib.error.HTTPError) as expired:
        urllib.request.urlopen(sandbox.download_url("signed.txt", use_signature_expiration=-60))
    assert expired.value.code == 401 and b"already expired" in expired.value.read()
    tampered = sandbox.download_url("signed.txt").replace("signed.txt", "other.txt", 1)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(tampered)
    assert refused.value.code == 401
    upload = httpx.post(sandbox.upload_url("up.txt"), files={"file": ("up.txt", b"uploaded")})
    assert upload.status_code == 200 and sandbox.files.read("up.txt") == "uploaded"


def test_proc_reads_through_the_files_api(sandbox: Sandbox) -> None:
    assert len(sandbox.files.read("/proc/sys/kernel/random/boot_id").strip()) == 36
    assert "Name:" in sandbox.files.read("/proc/self/status")
    with pytest.raises(SandboxException):
        sandbox.files.write("/proc/sys/kernel/hostname", "nope")


def test_commands_keep_what_e2b_keeps(sandbox: Sandbox) -> None:
    broken = sandbox.commands.run("printf 'aaa\\xe2'")
    assert broken.stdout == "aaa\ufffd"
    sleeper = sandbox.commands.run("sleep 60", background=True)
    Sandbox.kill(sandbox.sandbox_id)
    with pytest.raises(SandboxNotRunningException, match="killed or reached its end of life"):
        sleeper.wait()


def test_lists_newest_first_with_started_after_and_pages() -> None:
    first = Sandbox.create(template="e2b-dropin", metadata={"list": "mine"})
    second = Sandbox.create(template="e2b-dropin", metadata={"list": "mine"})
    try:
        query = SandboxQuery(metadata={"list": "mine"})
        assert [s.sandbox_id for s in Sandbox.list(query=query).next_items()] == [second.sandbox_id,
                                                                                  first.sandbox_id]
        assert [s.sandbox_id for s in Sandbox.list(query=query, order="asc").next_items()] == [
            first.sandbox_id, second.sandbox_id]
        pages = Sandbox.list(query=query, limit=1)
        assert [s.sandbox_id for s in pages.next_items()] == [second.sandbox_id] and pages.has_next
        assert [s.sandbox_id for s in pages.next_items()] == [first.sandbox_id] and not pages.has_next
        started = second.get_info().started_at
        after = SandboxQuery(metadata={"list": "mine"}, started_after=started)
        assert [s.sandbox_id for s in Sandbox.list(query=after).next_items()] == [second.sandbox_id]
        later = SandboxQuery(metadata={"list": "mine"}, started_after=started + datetime.timedelta(seconds=1))
        assert Sandbox.list(query=later).next_items() == []
        now = datetime.datetime.now(datetime.UTC)
        assert len(second.get_metrics(start=now - datetime.timedelta(minutes=1), end=now)) == 1
        assert second.get_metrics(start=now - datetime.timedelta(hours=2), end=now - datetime.timedelta(hours=1)) == []
    finally:
        first.kill()
        second.kill()


def test_snapshot_names_as_e2b_allows_them(sandbox: Sandbox) -> None:
    snapshot = sandbox.create_snapshot(name="snap-test_with_underscores")
    try:
        assert "snap-test_with_underscores" in snapshot.names
        assert [s.snapshot_id for s in Sandbox.list_snapshots(name="snap-test_with_underscores").next_items()] == [
            snapshot.snapshot_id]
    finally:
        Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_pause_modes(sandbox: Sandbox) -> None:
    boot_id = "cat /proc/sys/kernel/random/boot_id"
    sandbox.files.write("kept.txt", "files stay")
    sleeper = sandbox.commands.run("sleep 300", background=True)
    booted = sandbox.commands.run(boot_id).stdout
    assert sandbox.pause()  # full: the processes stay
    sandbox.connect()
    assert sleeper.pid in [process.pid for process in sandbox.commands.list()]
    assert sandbox.commands.run(boot_id).stdout == booted
    assert sandbox.pause(mode="filesystem")  # the files alone: it starts afresh over them, as a machine booted again
    assert not sandbox.is_running()
    sandbox.connect()
    assert sandbox.is_running()
    assert sandbox.files.read("kept.txt") == "files stay"
    assert sleeper.pid not in [process.pid for process in sandbox.commands.list()]
    assert sandbox.commands.run(boot_id).stdout != booted


def test_auto_pause_on_timeout_and_resume_by_connect() -> None:
    sandbox = Sandbox.create(template="e2b-dropin", timeout=2, lifecycle={"on_timeout": "pause"})
    try:
        sleeper = sandbox.commands.run("sleep 300", background=True)
        wait_for(lambda: sandbox.get_info().state == SandboxState.PAUSED, "paused at its timeout", timeout=20)
        assert not sandbox.is_running()
        time.sleep(1)
        assert sandbox.get_info().state == SandboxState.PAUSED  # paused, not ended
        sandbox.connect(timeout=60)
        assert sandbox.get_info().state == SandboxState.RUNNING
        assert sleeper.pid in [process.pid for process in sandbox.commands.list()]
    finally:
        sandbox.kill()


def test_watches_tell_the_daemons_own_events_and_relative_names(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("watched/nested")
    watcher = sandbox.files.watch_dir("watched", recursive=True)
    sandbox.files.write("watched/nested/file.txt", "one")
    events = [(event.name, event.type) for event in watcher.get_new_events()]
    assert events == [("nested/file.txt", FilesystemEventType.CREATE), ("nested/file.txt", FilesystemEventType.WRITE),
                      ("nested/file.txt", FilesystemEventType.CHMOD)]
    sandbox.commands.run("echo from-inside > watched/inside.txt")
    assert ("inside.txt", FilesystemEventType.CREATE) in [(e.name, e.type) for e in watcher.get_new_events()]
    sandbox.files.remove("watched/nested")
    assert ("nested", FilesystemEventType.REMOVE) in [(e.name, e.type) for e in watcher.get_new_events()]
    watcher.stop()


@pytest.mark.anyio
async def test_an_async_watch_follows_relative_paths() -> None:
    sandbox = await AsyncSandbox.create(template="e2b-dropin")
    try:
        await sandbox.files.make_dir("async-watched")
        seen = anyio.Event()
        names: list[str] = []

        def on_event(event: object) -> None:
            names.append(event.name)  # type: ignore[attr-defined]
            seen.set()

        handle = await sandbox.files.watch_dir("async-watched", on_event=on_event)
        await sandbox.files.write("async-watched/f.txt", "x")
        with anyio.fail_after(10):
            await seen.wait()
        await handle.stop()
        assert names[0] == "f.txt"
    finally:
        await sandbox.kill()


def test_get_host_reaches_a_port_with_the_traffic_token(sandbox: Sandbox, server: Process) -> None:
    sandbox.files.write("/tmp/port_server.py", PORT_SERVER)
    sandbox.commands.run("python3 /tmp/port_server.py 8000", background=True)
    host = sandbox.get_host(8000)
    assert host == f"8000-{sandbox.sandbox_id}.localhost:{server.port}"
    token = {"e2b-traffic-access-token": sandbox.traffic_access_token or ""}

    def hello() -> httpx.Response | None:
        answer = httpx.get(f"{server.url}/hello", headers={"Host": host, **token})
        return answer if answer.status_code == 200 else None

    assert wait_for(hello, "the port answers").text == "hello from sandbox"
    assert httpx.get(f"{server.url}/hello", headers={"Host": host}).status_code == 403


def test_network_settings_map_to_the_templates_allowlist_or_are_refused() -> None:
    with Sandbox.create(template="e2b-dropin", allow_internet_access=False) as closed:
        assert closed.commands.run("true").exit_code == 0
    with Sandbox.create(template="e2b-dropin", network={"deny_out": ["0.0.0.0/0"]}) as denied:
        assert denied.commands.run("true").exit_code == 0
    with pytest.raises(SandboxException, match="template 'basic' does not allow it"):
        Sandbox.create(template="e2b-dropin", allow_internet_access=True)
    with pytest.raises(SandboxException, match=r"denyOut: '8\.8\.8\.8'"):
        Sandbox.create(template="e2b-dropin", network={"deny_out": ["8.8.8.8"]})
    with pytest.raises(SandboxException, match="allowPublicTraffic"):
        Sandbox.create(template="e2b-dropin", network={"allow_public_traffic": True})
    with Sandbox.create(template="e2b-dropin") as sandbox:
        sandbox.update_network({"deny_out": ["0.0.0.0/0"]})
        with pytest.raises(SandboxException, match="does not allow it"):
            sandbox.update_network({"allow_out": ["10.1.2.3"], "deny_out": ["0.0.0.0/0"]})


def test_a_timeout_of_zero_ends_or_pauses_at_once() -> None:
    sandbox = Sandbox.create(template="e2b-dropin", lifecycle={"on_timeout": {"action": "pause", "keep_memory": None}})
    try:
        boot = sandbox.files.read("/proc/sys/kernel/random/boot_id")
        sandbox.set_timeout(0)
        wait_for(lambda: not sandbox.is_running(), "paused at once", timeout=20)
        resumed = sandbox.connect()
        assert resumed.files.read("/proc/sys/kernel/random/boot_id") == boot  # its memory kept: no reboot
    finally:
        sandbox.kill()
