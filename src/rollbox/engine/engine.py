"""One machine's sandboxes: create, exec, files, reset, fork, snapshot, pause, delete, recover.

Every sandbox is an OCI container whose init is the exec agent, over an overlay of read-only
layers and its own tmpfs upper. The engine records each one in its store before touching the
machine, so a restarted engine adopts what runs and removes what nobody knows.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from rollbox.engine import accounts, mounts
from rollbox.engine.agent import agent_binary, compat_library
from rollbox.engine.agent_client import AgentClient, ExecRequest, OutputCallback
from rollbox.engine.builder import Builder, Progress
from rollbox.engine.cgroups import Cgroups
from rollbox.engine.files import SandboxFiles
from rollbox.engine.hostbase import host_binds
from rollbox.engine.layers import SKELETON, UPPER_PREFIX, LayerStore, remove_tree
from rollbox.engine.network import Networks
from rollbox.engine.oci import AGENT_PATH, AGENT_SOCKET_DIR, COMPAT_PATH, Bind, ContainerConfig, container_spec
from rollbox.engine.runtimes import AGENT_FD, Runtime, make_runtime
from rollbox.engine.store import Image, SandboxRecord, Store
from rollbox.errors import (
    InvalidRequest,
    InvalidResource,
    SandboxNotFound,
    SandboxNotRunning,
    SnapshotNotFound,
    TemplateNotFound,
)
from rollbox.models import ExecResult, SandboxInfo, SandboxStats, SnapshotInfo
from rollbox.spec import Limits, Network, SandboxTemplate

DEFAULT_DATA_DIR = Path("/var/lib/rollbox")
RUN_ROOT = Path("/run/rollbox")
"""Where each engine keeps its sandboxes' sockets, in `<engine id>/` unless given a `run_dir`."""
BASE_ENV = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC", "HOSTNAME": "sandbox", "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1"}
"""Every command's environment. No bytecode caches: Python validates a .pyc by the source's mtime in
whole seconds and its size, so a same-size fix written in the second a test imported the module would
silently run the old code (and earn the old reward)."""
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FORK_COPY_BYTES = 8 * 2**20
"""A parent that has written at most this much keeps running through a fork: its files are copied into each
child's upper while its processes are frozen. Past it, copying would cost more than freezing the upper in
place as a shared layer, which restarts the parent."""


class Engine:
    """Sandboxes on this machine. Thread-safe; one engine per data directory.

    `network_pool` is the private IPv4 network whose /30s go to sandboxes with an egress allowlist.
    """

    def __init__(self, data_dir: str | Path = DEFAULT_DATA_DIR, *, run_dir: str | Path | None = None,
                 recover: bool = True, network_pool: str | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Image layers may hold setuid files and device nodes: no host user but root may reach them.
        self.data_dir.chmod(0o700)
        self.store = Store(self.data_dir / "state.db")
        self.id = self.store.meta("engine_id", secrets.token_hex(4))
        self.run_dir = Path(run_dir) if run_dir else RUN_ROOT / self.id
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.sandbox_dir = self.data_dir / "sandboxes"
        self.sandbox_dir.mkdir(exist_ok=True)
        self.layers = LayerStore(self.data_dir)
        self.cgroups = Cgroups(self.id)
        self.networks = Networks(self.id, self.run_dir, network_pool)
        self.agent = agent_binary(self.data_dir / "bin")
        self.compat = compat_library(self.data_dir / "bin")
        self._runtimes: dict[str, Runtime] = {}
        self._lock = threading.RLock()
        self.builder = Builder(self.layers, self.runtime("runc"), self.data_dir / "build", self.cgroups)
        self._sandbox_locks: dict[str, threading.RLock] = {}
        self._closed = threading.Event()
        self._reaper: threading.Thread | None = None
        self._records = {record.id: record for record in self.store.sandboxes()}
        """Every sandbox's record, mirrored from the store: commands never wait on SQLite."""
        if recover:
            self.recover()

    # -- runtimes and templates -------------------------------------------------------------

    def runtime(self, name: str) -> Runtime:
        with self._lock:
            if name not in self._runtimes:
                self._runtimes[name] = make_runtime(name, self.data_dir / "runtime")
            return self._runtimes[name]

    def build(self, template: SandboxTemplate, progress: Progress | None = None) -> Image:
        """Builds a template (cached by content) and records it under its name."""
        runtime = self.runtime(template.spec.runtime)
        if template.spec.network.mode == "allowlist" and not runtime.joins_netns:
            raise InvalidResource(
                f"SandboxTemplate {template.metadata.name}: spec.network: mode allowlist needs a runtime that "
                f"joins a prepared network namespace, and {runtime.name} here cannot: use runtime runc, "
                "or mode none")
        image = self.builder.build(template, progress)
        spec = template.model_dump_json(by_alias=True)
        self.store.put_template(template.metadata.name, spec, image, time.time())
        return image

    def template(self, name: str) -> SandboxTemplate:
        found = self.store.template(name)
        if found is None:
            raise TemplateNotFound(f"template {name!r} is not built on this node: apply it first")
        return SandboxTemplate.model_validate_json(found[0])

    def templates(self) -> list[str]:
        return [name for name, *_ in self.store.templates()]

    def delete_template(self, name: str) -> None:
        self.store.delete_template(name)
        self.collect_layers()

    # -- sandbox lifecycle ------------------------------------------------------------------

    def create(self, template: str | None = None, *, snapshot: str | None = None,
               env: dict[str, str] | None = None, limits: Limits | None = None,
               labels: dict[str, str] | None = None) -> Sandbox:
        """Starts a sandbox from a built template or a snapshot and waits until its agent answers."""
        if snapshot is not None:
            found = self.store.snapshot(snapshot)
            if found is None:
                raise SnapshotNotFound(f"snapshot {snapshot!r} does not exist")
            template, image = found[0], found[1]
        elif template is None:
            raise InvalidRequest("give a template or a snapshot to create a sandbox from")
        else:
            built = self.store.template(template)
            if built is None:
                raise TemplateNotFound(f"template {template!r} is not built on this node: apply it first")
            image = built[1]
        spec = self.template(template).spec
        record = self._new_record(template, spec.runtime, image, limits or spec.limits, env or {}, labels or {})
        record.snapshot = snapshot
        self._launch(record)
        return Sandbox(self, record.id)

    def _new_record(self, template: str, runtime: str, image: Image, limits: Limits, env: dict[str, str],
                    labels: dict[str, str]) -> SandboxRecord:
        account = accounts.resolve(self.layers.stack_paths(image.layers), image.user)
        now = time.time()
        return SandboxRecord(
            id=secrets.token_hex(8), template=template, runtime=runtime, image=image, baseline=image,
            upper="", generation=0, limits=limits.model_dump(), env=env, uid=account.uid, gid=account.gid,
            groups=list(account.groups), home=image.workdir or account.home, created_at=now,
            expires_at=now + limits.lifetime if limits.lifetime else None, labels=labels,
        )

    def _launch(self, record: SandboxRecord, seed: Path | None = None) -> None:
        """Starts a sandbox on a new upper (a copy of the upper directory `seed`, or empty)."""
        record.upper = self.layers.new_upper_id()
        self._save(record)
        try:
            self.layers.create_upper(record.upper, Limits(**record.limits).disk, seed)
            self._start(record)
        except BaseException:
            self._destroy(record)
            raise
        if record.expires_at:
            self._ensure_reaper()

    def _start(self, record: SandboxRecord) -> None:
        """Mounts the sandbox's root filesystem and starts its container."""
        runtime = self.runtime(record.runtime)
        bundle = self.sandbox_dir / record.id
        rootfs = bundle / "rootfs"
        rootfs.mkdir(parents=True, exist_ok=True)
        upper, work = self.layers.upper_dirs(record.upper)
        if not os.path.ismount(rootfs):  # an overlay has its own device: no scan of a mount table that grows
            lowers = self.layers.stack_paths([SKELETON, *record.image.layers])
            mounts.mount_overlay(rootfs, lowers, upper, work)
        run = self.run_dir / record.id
        run.mkdir(exist_ok=True, mode=0o700)
        netns = self.networks.ensure(record.id, self._network(record))
        binds = [Bind(str(self.agent), AGENT_PATH), *runtime.binds(rootfs)]
        if record.image.host_binds:
            binds += host_binds()
        if runtime.passes_fds:
            args = [AGENT_PATH, "--fd", str(AGENT_FD)]
        else:
            binds.append(Bind(str(run), AGENT_SOCKET_DIR, readonly=False))
            args = [AGENT_PATH, "--path", f"{AGENT_SOCKET_DIR}/agent.sock"]
        if runtime.exec_env:
            binds.append(Bind(str(self.compat), COMPAT_PATH))
        limits = Limits(**record.limits)
        spec = container_spec(ContainerConfig(
            args=args, cgroups_path=self.cgroups.path_for(record.container_id), limits=limits, binds=binds,
            disk_in_memory=limits.disk, netns=str(netns) if netns else None))
        runtime.adjust(spec)
        (bundle / "config.json").write_text(json.dumps(spec))
        socket_path = run / "agent.sock"
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        listener = None
        if runtime.passes_fds:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(socket_path))
            listener.listen(512)
        try:
            runtime.start(record.container_id, bundle, listener.fileno() if listener else None,
                          bundle / "agent.log")
        finally:
            if listener:
                listener.close()
        self._agent(record).wait_ready()

    def _network(self, record: SandboxRecord) -> Network:
        """The template's network policy; none (the safest) once the template is gone."""
        found = self.store.template(record.template)
        return SandboxTemplate.model_validate_json(found[0]).spec.network if found else Network()

    def _stop(self, record: SandboxRecord) -> None:
        """Kills the container and unmounts its root filesystem; the upper stays."""
        self.runtime(record.runtime).delete(record.container_id)
        self.cgroups.remove(record.container_id)
        mounts.umount(self.sandbox_dir / record.id / "rootfs")

    def _destroy(self, record: SandboxRecord) -> None:
        self._stop(record)
        self.networks.release(record.id)
        if record.upper:
            self.layers.remove(record.upper)
        remove_tree(self.sandbox_dir / record.id)
        shutil.rmtree(self.run_dir / record.id, ignore_errors=True)
        self.store.delete_sandbox(record.id)
        self._records.pop(record.id, None)
        with self._lock:
            self._sandbox_locks.pop(record.id, None)

    def _record(self, sandbox_id: str) -> SandboxRecord:
        record = self._records.get(sandbox_id)
        if record is None:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist (deleted, expired or never created)")
        return record

    def _save(self, record: SandboxRecord) -> None:
        self.store.put_sandbox(record)
        self._records[record.id] = record

    def alive(self, sandbox_id: str) -> bool:
        """Whether the sandbox's agent answers (a paused sandbox counts as alive)."""
        record = self._record(sandbox_id)
        return record.state == "paused" or self._agent(record).ping(timeout=1.0)

    def exit_fd(self, sandbox_id: str) -> int | None:
        """A descriptor that turns readable once the sandbox's container has stopped (a pidfd of its
        init), so that one epoll can watch thousands of sandboxes; the caller closes it. None when its
        runtime does not say which process that is; SandboxNotRunning when it has stopped already."""
        record = self._record(sandbox_id)
        try:
            return self.runtime(record.runtime).init_pidfd(record.container_id)
        except ProcessLookupError:
            raise SandboxNotRunning(f"sandbox {sandbox_id} has stopped: reset it or create a new one") from None

    def stopped(self, sandbox_id: str) -> bool:
        """Whether the sandbox's container has stopped, told by its init's pidfd: no round trip to the agent,
        so a listing can ask it of every sandbox. False when the runtime cannot tell (see exit_fd)."""
        try:
            fd = self.exit_fd(sandbox_id)
        except SandboxNotRunning:
            return True
        if fd is None:
            return False
        try:
            return bool(select.select([fd], [], [], 0)[0])  # a pidfd turns readable once its process exits
        finally:
            os.close(fd)

    def _locked(self, sandbox_id: str) -> threading.RLock:
        with self._lock:
            return self._sandbox_locks.setdefault(sandbox_id, threading.RLock())

    def get(self, sandbox_id: str) -> Sandbox:
        self._record(sandbox_id)
        return Sandbox(self, sandbox_id)

    def info(self, sandbox_id: str) -> SandboxInfo:
        return _info(self._record(sandbox_id))

    def list(self) -> list[SandboxInfo]:
        return [_info(record) for record in list(self._records.values())]

    def delete(self, sandbox_id: str) -> None:
        with self._locked(sandbox_id):
            record = self._record(sandbox_id)
            if record.state == "paused":
                self.cgroups.freeze(record.container_id, False)
            self._destroy(record)
        if _has_frozen_layers(record.image):
            self.collect_layers()

    def reset(self, sandbox_id: str) -> None:
        """Puts the sandbox back to the state it was created from (its template or snapshot)."""
        with self._locked(sandbox_id):
            record = self._record(sandbox_id)
            old_image = record.image
            self._stop(record)
            self.layers.remove(record.upper)
            record.image = record.baseline
            record.generation += 1
            record.state = "running"
            self._launch(record)
        if _has_frozen_layers(old_image):
            self.collect_layers()

    def _freeze_upper(self, record: SandboxRecord) -> Image:
        """Stops the sandbox, turns its upper into a read-only layer and restarts it over that layer."""
        self._stop(record)
        layer = self.layers.promote(record.upper)
        record.image = replace(record.image, layers=[layer, *record.image.layers])
        record.generation += 1
        record.state = "running"
        return record.image

    def fork(self, sandbox_id: str, count: int) -> list[Sandbox]:
        """Gives `count` new sandboxes starting from this one's files; their processes start afresh.

        A parent that has written little (FORK_COPY_BYTES) keeps running, its processes frozen while its
        files are copied. A larger one has its upper frozen in place as a layer the children share, at a
        cost independent of its size, and restarts over it too (its processes do not carry over).
        """
        if not 1 <= count <= 64:
            raise InvalidRequest("fork count must be between 1 and 64")
        with self._locked(sandbox_id):
            parent = self._record(sandbox_id)
            copied = self.layers.upper_bytes(parent.upper) <= FORK_COPY_BYTES
            image = parent.image if copied else self._freeze_upper(parent)
            children = [self._new_record(parent.template, parent.runtime, image, Limits(**parent.limits),
                                         parent.env, parent.labels) for _ in range(count)]
            for child in children:
                child.baseline, child.parent, child.snapshot = parent.baseline, parent.id, parent.snapshot
            seed = self.layers.upper_dirs(parent.upper)[0] if copied else None
            hold = copied and parent.state == "running"
            with ThreadPoolExecutor(max_workers=min(count + 1, 8)) as pool:
                if hold:
                    self.cgroups.freeze(parent.container_id, True)
                try:
                    results = [pool.submit(self._launch, child, seed) for child in children]
                    if not copied:
                        results.append(pool.submit(self._launch, parent))
                    errors = [f.exception() for f in results if f.exception()]
                finally:
                    if hold:
                        self.cgroups.freeze(parent.container_id, False)
            if errors:
                for child in children:
                    with contextlib.suppress(Exception):
                        self.delete(child.id)
                raise errors[0]  # type: ignore[misc]
        return [Sandbox(self, child.id) for child in children]

    def snapshot(self, sandbox_id: str, name: str) -> SnapshotInfo:
        """Saves the sandbox's files under `name`; new sandboxes can start from it."""
        with self._locked(sandbox_id):
            record = self._record(sandbox_id)
            image = self._freeze_upper(record)
            now = time.time()
            self.store.put_snapshot(name, record.template, image, record.id, now)
            self._launch(record)
        return SnapshotInfo(name=name, template=record.template, created_at=now, source=record.id)

    def snapshots(self) -> list[SnapshotInfo]:
        return [SnapshotInfo(name=n, template=t, created_at=c, source=s) for n, t, _, s, c in self.store.snapshots()]

    def delete_snapshot(self, name: str) -> None:
        if self.store.snapshot(name) is None:
            raise SnapshotNotFound(f"snapshot {name!r} does not exist")
        self.store.delete_snapshot(name)
        self.collect_layers()

    def pause(self, sandbox_id: str) -> None:
        """Freezes every process of the sandbox: it uses no CPU and keeps its memory and files."""
        with self._locked(sandbox_id):
            record = self._record(sandbox_id)
            if record.state != "paused":
                self.cgroups.freeze(record.container_id, True)
                record.state = "paused"
                self._save(record)

    def resume(self, sandbox_id: str) -> None:
        with self._locked(sandbox_id):
            record = self._record(sandbox_id)
            if record.state == "paused":
                self.cgroups.freeze(record.container_id, False)
                record.state = "running"
                self._save(record)

    # -- commands and files -----------------------------------------------------------------

    def _agent(self, record: SandboxRecord) -> AgentClient:
        return AgentClient(str(self.run_dir / record.id / "agent.sock"), record.id)

    def _exec_request(self, record: SandboxRecord, command: str | Sequence[str], timeout: float | None,
                      env: dict[str, str] | None, cwd: str | None, user: str | None, stdin: bytes | str | None,
                      output_limit: int | None, isolated: bool) -> ExecRequest:
        if record.state == "paused":
            raise SandboxNotRunning(f"sandbox {record.id} is paused: resume it before running commands")
        runtime = self.runtime(record.runtime)
        if isolated and not runtime.isolates_commands:
            raise InvalidRequest(f"sandbox {record.id} runs on {record.runtime}, which cannot run isolated "
                                 "commands: use a runc template, or run the command without isolation")
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv:
            raise InvalidRequest("the command is empty")
        if user is None:
            identity = (record.uid, record.gid, tuple(record.groups))
            home = record.home
        else:
            account = accounts.resolve([self.sandbox_dir / record.id / "rootfs"], user)
            identity, home = (account.uid, account.gid, account.groups), account.home
        full_env = {**BASE_ENV, "PATH": PATH_ENV, "HOME": home, **runtime.exec_env,
                    **record.image.env, **record.env, **(env or {})}
        return ExecRequest(
            argv=argv, env=full_env, cwd=cwd or record.image.workdir or home, user=identity, timeout=timeout,
            output_cap=output_limit or record.limits["output"],
            stdin=stdin.encode() if isinstance(stdin, str) else stdin, isolated=isolated,
        )

    def exec(self, sandbox_id: str, command: str | Sequence[str], *, timeout: float | None = None,
             env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None,
             stdin: bytes | str | None = None, output_limit: int | None = None, isolated: bool = False,
             on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None) -> ExecResult:
        """Runs a command (a shell string or an argv list) and returns when it ends or times out.

        `isolated` runs it in a throw-away copy of the sandbox: it sees the sandbox's files, but what it
        writes, its processes, IPC objects and sockets are its own and gone when it ends (runc only)."""
        record = self._record(sandbox_id)
        request = self._exec_request(record, command, timeout, env, cwd, user, stdin, output_limit, isolated)
        return self._agent(record).run(request, on_stdout, on_stderr)

    async def exec_async(self, sandbox_id: str, command: str | Sequence[str], *, timeout: float | None = None,
                         env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None,
                         stdin: bytes | str | None = None, output_limit: int | None = None,
                         isolated: bool = False, on_stdout: OutputCallback | None = None,
                         on_stderr: OutputCallback | None = None) -> ExecResult:
        record = self._record(sandbox_id)
        request = self._exec_request(record, command, timeout, env, cwd, user, stdin, output_limit, isolated)
        return await self._agent(record).run_async(request, on_stdout, on_stderr)

    def files(self, sandbox_id: str) -> SandboxFiles:
        record = self._record(sandbox_id)
        return SandboxFiles(str(self.sandbox_dir / record.id / "rootfs"), record.home, record.uid, record.gid,
                            Limits(**record.limits).upload)

    def stats(self, sandbox_id: str) -> SandboxStats:
        record = self._record(sandbox_id)
        name = record.container_id
        memory, peak = self.cgroups.memory(name)
        upper, _ = self.layers.upper_dirs(record.upper)
        usage = os.statvfs(upper)
        return SandboxStats(memory_bytes=memory, memory_peak_bytes=peak, cpu_seconds=self.cgroups.cpu_seconds(name),
                            pids=self.cgroups.pids(name),
                            disk_bytes=(usage.f_blocks - usage.f_bfree) * usage.f_frsize)

    # -- durability and clean-up ------------------------------------------------------------

    def recover(self) -> None:
        """Adopts the sandboxes the store knows and removes everything of this engine it does not."""
        self._records = {record.id: record for record in self.store.sandboxes()}
        records = list(self._records.values())
        for record in records:
            try:
                self._adopt(record)
            except Exception:
                with contextlib.suppress(Exception):
                    self._destroy(record)
        self._remove_orphans()
        if any(record.expires_at for record in self._records.values()):
            self._ensure_reaper()

    def _adopt(self, record: SandboxRecord) -> None:
        upper, _ = self.layers.upper_dirs(record.upper)
        if not upper.is_dir() or any(not self.layers.exists(layer) for layer in record.image.layers):
            raise SandboxNotRunning(f"sandbox {record.id} lost its files (was the machine restarted?)")
        if record.state == "paused" and self.cgroups.is_frozen(record.container_id):
            return
        if self._agent(record).ping():
            return
        # The container died while nobody watched: start it again over the same files.
        self._stop(record)
        record.generation += 1
        record.state = "running"
        self._save(record)
        self._start(record)

    def _remove_orphans(self) -> None:
        records = list(self._records.values())
        containers = {record.container_id for record in records}
        ids = {record.id for record in records}
        for runtime_dir in (self.data_dir / "runtime").glob("*"):
            runtime = self.runtime(runtime_dir.name)
            for container in runtime.list():
                if container not in containers:
                    runtime.delete(container)
        for name in self.cgroups.existing():
            if name not in containers:
                self.cgroups.remove(name)
        for directory in self.sandbox_dir.iterdir():
            if directory.name not in ids:
                remove_tree(directory)
        self.networks.remove_orphans(ids)
        for directory in self.run_dir.iterdir():
            if directory.name not in ids:
                shutil.rmtree(directory, ignore_errors=True)
        for leftover in self.builder.work_dir.iterdir():
            remove_tree(leftover)
        for partial in self.layers.layers.glob(".partial-*"):
            remove_tree(partial)
        self.collect_layers()

    def collect_layers(self) -> None:
        """Removes sandbox-made layers (frozen uppers) that no sandbox or snapshot uses any more."""
        with self._lock:
            # List first, then read what is referenced: an upper is recorded before it is created,
            # so every upper in the listing is in the references read after it.
            candidates = [layer for layer in self.layers.all_ids() if layer.startswith(UPPER_PREFIX)]
            used = self.store.referenced_layers()
            for layer in candidates:
                if layer not in used:
                    self.layers.remove(layer)

    def _ensure_reaper(self) -> None:
        with self._lock:
            if self._reaper is None or not self._reaper.is_alive():
                self._reaper = threading.Thread(target=self._reap, name="rollbox-reaper", daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        while not self._closed.wait(0.5):
            now = time.time()
            for record in list(self._records.values()):
                if record.expires_at and record.expires_at <= now:
                    with contextlib.suppress(Exception):
                        self.delete(record.id)

    def destroy_all(self) -> None:
        """Deletes every sandbox and snapshot of this engine (templates and their layers stay)."""
        for record in list(self._records.values()):
            with contextlib.suppress(SandboxNotFound):
                self.delete(record.id)
        for name, *_ in self.store.snapshots():
            self.store.delete_snapshot(name)
        self.collect_layers()
        self.cgroups.prune()

    def destroy(self) -> None:
        """Removes everything of this engine from the machine: sandboxes, snapshots, and then any
        mount, cgroup or socket directory still left. The data directory keeps templates and layers."""
        self.destroy_all()
        self.close()
        for point in mounts.mounted_under(self.data_dir):
            mounts.umount(point, lazy=True)
        self.cgroups.remove_all()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def close(self) -> None:
        """Stops background work. Sandboxes keep running; a new engine on the same data adopts them."""
        self._closed.set()
        self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _has_frozen_layers(image: Image) -> bool:
    """Whether dropping a sandbox over `image` can leave a frozen upper unused.

    Only then is `collect_layers` worth its cost, which grows with the number of sandboxes.
    """
    return any(layer.startswith(UPPER_PREFIX) for layer in image.layers)


def _info(record: SandboxRecord) -> SandboxInfo:
    return SandboxInfo(id=record.id, template=record.template, state=record.state,  # type: ignore[arg-type]
                       runtime=record.runtime, created_at=record.created_at, expires_at=record.expires_at,
                       snapshot=record.snapshot, parent=record.parent, labels=record.labels)


class Sandbox:
    """A handle on one sandbox of an engine."""

    def __init__(self, engine: Engine, sandbox_id: str) -> None:
        self.engine = engine
        self.id = sandbox_id

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    def exec(self, command: str | Sequence[str], **options: object) -> ExecResult:
        return self.engine.exec(self.id, command, **options)  # type: ignore[arg-type]

    async def exec_async(self, command: str | Sequence[str], **options: object) -> ExecResult:
        return await self.engine.exec_async(self.id, command, **options)  # type: ignore[arg-type]

    @property
    def files(self) -> SandboxFiles:
        return self.engine.files(self.id)

    @property
    def info(self) -> SandboxInfo:
        return self.engine.info(self.id)

    def stats(self) -> SandboxStats:
        return self.engine.stats(self.id)

    def reset(self) -> None:
        self.engine.reset(self.id)

    def fork(self, count: int) -> list[Sandbox]:
        return self.engine.fork(self.id, count)

    def snapshot(self, name: str) -> SnapshotInfo:
        return self.engine.snapshot(self.id, name)

    def pause(self) -> None:
        self.engine.pause(self.id)

    def resume(self) -> None:
        self.engine.resume(self.id)

    def delete(self) -> None:
        self.engine.delete(self.id)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(SandboxNotFound):
            self.delete()

