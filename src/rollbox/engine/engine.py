"""One machine's containers: create, exec, files, reset, fork, snapshot, pause, delete, recover.

Every container's init is the exec agent, over an overlay of read-only layers and its own tmpfs
upper. The engine records each one in its store before touching the machine, so a restarted engine
adopts what runs and removes what nobody knows (`recovery`). Starting and stopping containers is the
`launcher`'s job, turning a caller's command into the agent's request `commands`'. The steps the
operations share are `lifecycle`'s; fork and snapshot are `layering`'s (files) and `live`'s (processes
and memory too).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from rollbox.engine import accounting, determinism, mounts, recovery, volumes
from rollbox.engine.agent import agent_binary, compat_library
from rollbox.engine.agent_client import AgentRequest, OutputCallback
from rollbox.engine.builder import Builder, Progress
from rollbox.engine.cgroups import Cgroups
from rollbox.engine.checkpoints import Checkpoints
from rollbox.engine.collection import Collection, has_frozen_layers
from rollbox.engine.commands import agent_request
from rollbox.engine.container import Container, ContainerInfo
from rollbox.engine.files import ContainerFiles
from rollbox.engine.images.registry import Credentials, RegistrySettings
from rollbox.engine.images.store import ImageStore, PulledImage
from rollbox.engine.launcher import Launcher
from rollbox.engine.layering import Layering
from rollbox.engine.layers import LayerStore
from rollbox.engine.lifecycle import Lifecycle
from rollbox.engine.live import Live
from rollbox.engine.network import Networks
from rollbox.engine.processes import ContainerProcesses
from rollbox.engine.runtimes import Runtime
from rollbox.engine.store import ContainerRecord, Image, Store
from rollbox.engine.templates import Templates
from rollbox.errors import InvalidRequest, SandboxNotFound, SnapshotNotFound
from rollbox.models import MAX_FORK, ExecResult, SandboxStats, SnapshotInfo
from rollbox.spec import Limits, Network, SandboxTemplate

DEFAULT_DATA_DIR = Path("/var/lib/rollbox")
RUN_ROOT = Path("/run/rollbox")
"""Where each engine keeps its containers' sockets, in `<engine id>/` unless given a `run_dir`."""


class Engine:
    """Containers on this machine. Thread-safe; one engine per data directory.

    `network_pool` is the private IPv4 network whose /30s go to containers with an egress allowlist.
    """

    def __init__(self, data_dir: str | Path = DEFAULT_DATA_DIR, *, run_dir: str | Path | None = None,
                 recover: bool = True, network_pool: str | None = None, checkpoint_budget: int | None = None,
                 registries: RegistrySettings | None = None, image_budget: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Image layers may hold setuid files and device nodes: no host user but root may reach them.
        self.data_dir.chmod(0o700)
        self.store = Store(self.data_dir / "state.db")
        self.id = self.store.meta("engine_id", secrets.token_hex(4))
        self.run_dir = Path(run_dir) if run_dir else RUN_ROOT / self.id
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.layers = LayerStore(self.data_dir)
        self.cgroups = Cgroups(self.id)
        self.networks = Networks(self.id, self.run_dir, network_pool)
        self.launcher = Launcher(self.data_dir, self.run_dir, self.layers, self.cgroups, self.networks,
                                 agent_binary(self.data_dir / "bin"), compat_library(self.data_dir / "bin"))
        self.images = ImageStore(self.layers, self.data_dir / "images", self.data_dir / "build",
                                 registries or RegistrySettings(), lambda: self._templates.layers_held(), image_budget)
        self.builder = Builder(self.layers, self.runtime("runc"), self.data_dir / "build", self.cgroups, self.images)
        self._templates = Templates(self.store, self.builder, self.runtime)
        self.volumes = volumes.Volumes(self.data_dir)
        self.checkpoints = Checkpoints(self.data_dir, self.launcher, checkpoint_budget)
        self._lifecycle = Lifecycle(self.store, self.layers, self.launcher, self._templates, self.checkpoints,
                                    self.delete)
        self._records = self._lifecycle.records
        self._record = self._lifecycle.record
        self._locked = self._lifecycle.locked
        self._started = self._lifecycle.started
        self._layering = Layering(self._lifecycle, self.cgroups, self.delete)
        self._live = Live(self._lifecycle, self.delete)
        self._collection = Collection(self.store, self.layers, self.checkpoints)
        self._file_clock = determinism.FileClock()
        if recover:
            self.recover()

    # -- runtimes and templates -------------------------------------------------------------

    def runtime(self, name: str) -> Runtime:
        return self.launcher.runtime(name)

    def build(self, template: SandboxTemplate, progress: Progress | None = None,
              credentials: Credentials | None = None) -> Image:
        """Builds a template (cached by content) and records it under its name; `credentials` read its base image."""
        return self._templates.build(template, progress, credentials)

    def image_template(self, pulled: PulledImage, runtime: str = "runc") -> str:
        """The template that starts a pulled image as it is (`images.pull` decides who may): made once per image
        digest and runtime."""
        return self._templates.from_image(pulled, runtime)

    def template(self, name: str) -> SandboxTemplate:
        return self._templates.get(name)

    def templates(self) -> list[str]:
        return self._templates.names()

    def delete_template(self, name: str) -> None:
        self.store.delete_template(name)
        self._collection.collect_layers()

    # -- container lifecycle ----------------------------------------------------------------

    def create(self, template: str | None = None, *, snapshot: str | None = None,
               env: dict[str, str] | None = None, limits: Limits | None = None,
               labels: dict[str, str] | None = None, volume_mounts: Sequence[tuple[str, str, bool]] = (),
               seed: int | None = None) -> Container:
        """Starts a container from a built template or a snapshot and waits until its agent answers.

        `volume_mounts` binds named volumes into it: (volume key, mount path, read-only) each. A `seed` (or a template
        with `spec.deterministic`) makes it deterministic (docs/determinism.md)."""
        if snapshot is not None:
            found = self.store.snapshot(snapshot)
            if found is None:
                raise SnapshotNotFound(f"snapshot {snapshot!r} does not exist")
            template, image = found[0], found[1]
        elif template is None:
            raise InvalidRequest("give a template or a snapshot to create a container from")
        else:
            image = self._templates.image(template)
        spec = self._templates.get(template).spec
        record = self._lifecycle.new_record(template, spec.runtime, image, limits or spec.limits, env or {},
                                            labels or {})
        record.snapshot, record.determinism = snapshot, determinism.settings(spec, Limits(**record.limits), seed)
        record.volumes = [volumes.attachment(self.volumes.get(key), path, ro) for key, path, ro in volume_mounts]
        self._lifecycle.launch(record, checkpoint=image.checkpoint)
        return Container(self, record.id)

    def alive(self, container_id: str) -> bool:
        """Whether the container's agent answers (a paused container counts as alive)."""
        record = self._record(container_id)
        return record.state in ("paused", "standby") or self.launcher.agent_client(record).ping(timeout=1.0)

    def exit_fd(self, container_id: str) -> int | None:
        """See `Launcher.exit_fd`."""
        return self.launcher.exit_fd(self._started(container_id))

    def stopped(self, container_id: str) -> bool:
        """Whether the container has stopped: it failed to start again (`Lifecycle.relaunch`), or see
        `Launcher.stopped`."""
        record = self._record(container_id)
        return record.state == "stopped" or self.launcher.stopped(record)

    def listen(self, container_id: str, host: str, port: int) -> socket.socket:
        """See `Launcher.listen`."""
        return self.launcher.listen(self._record(container_id), host, port)

    def get(self, container_id: str) -> Container:
        self._record(container_id)
        return Container(self, container_id)

    def info(self, container_id: str) -> ContainerInfo:
        return ContainerInfo.of(self._record(container_id))

    def list(self) -> list[ContainerInfo]:
        return [ContainerInfo.of(record) for record in list(self._records.values())]

    def delete(self, container_id: str) -> None:
        with self._locked(container_id):
            record = self._record(container_id)
            if record.state == "paused":
                self.cgroups.freeze(record.oci_id, False)
            self._lifecycle.destroy(record)
        if has_frozen_layers(record.image):
            self._collection.collect_layers()
        if record.checkpoint or record.baseline.checkpoint:
            self._collection.collect_checkpoints()

    # -- state operations -------------------------------------------------------------------

    def seed(self, container_id: str, seed: int) -> None:
        """Starts a deterministic container's clock, random streams and file times again at `seed`'s start."""
        with self._locked(container_id):
            self._lifecycle.reseed(self._record(container_id), seed)

    def reset(self, container_id: str) -> None:
        """Puts the container back to the state it was created from (its template or snapshot)."""
        with self._locked(container_id):
            record = self._record(container_id)
            old_image = record.image
            self._lifecycle.reset(record)
        if has_frozen_layers(old_image):
            self._collection.collect_layers()

    def fork(self, container_id: str, count: int) -> list[Container]:
        """Gives `count` new containers starting from this one's files (`layering`), and from its processes and
        memory too where its runtime can checkpoint (`live`)."""
        if not 1 <= count <= MAX_FORK:
            raise InvalidRequest(f"fork count must be between 1 and {MAX_FORK}")
        with self._locked(container_id):
            parent = self._started(container_id)
            self.launcher.check_startable(parent, "fork")
            state = self.launcher.determinism_state(self._awake(parent))
            if self.carries_memory(container_id):
                children = self._live.fork(parent, count)
            else:
                children = self._layering.fork(parent, count)
            if state:
                determinism.seed_fork(self._lifecycle.reseed, parent, children, state)
        return [Container(self, child.id) for child in children]

    def snapshot(self, container_id: str, name: str) -> SnapshotInfo:
        """Saves the container's files (and, where its runtime can checkpoint, its processes and memory) under
        `name`; new containers can start from it."""
        with self._locked(container_id):
            record = self._started(container_id)
            self.launcher.check_startable(record, "snapshot")
            if not self.carries_memory(container_id):
                now = self._layering.snapshot(record, name)
                return SnapshotInfo(name=name, template=record.template, created_at=now, source=record.id)
            now = self._live.snapshot(self._awake(record), name)
            self._collection.collect_checkpoints()  # the image of a snapshot this one replaced
            return SnapshotInfo(name=name, template=record.template, created_at=now, source=record.id, memory=True,
                                size=self.snapshot_size(name))

    def snapshots(self) -> list[SnapshotInfo]:
        return [SnapshotInfo(name=n, template=t, created_at=c, source=s, memory=i.checkpoint is not None,
                             size=self._collection.image_size(i)) for n, t, i, s, c in self.store.snapshots()]

    def delete_snapshot(self, name: str) -> None:
        if self.store.snapshot(name) is None:
            raise SnapshotNotFound(f"snapshot {name!r} does not exist")
        self.store.delete_snapshot(name)
        self._collection.collect_layers()
        self._collection.collect_checkpoints()

    # -- processes and memory (gVisor: engine/live.py) ---------------------------------------

    def carries_memory(self, container_id: str) -> bool:
        """Whether fork, snapshot and pause keep the container's processes and memory (its runtime can
        checkpoint), or its files alone (fork, snapshot) and its memory in place (pause)."""
        return self.runtime(self._record(container_id).runtime).checkpoints

    def snapshot_size(self, name: str) -> int | None:
        found = self.store.snapshot(name)
        return None if found is None else self._collection.image_size(found[1])

    def _awake(self, record: ContainerRecord) -> ContainerRecord:
        """The record of a container that runs, restoring one in standby first (callers hold its lock)."""
        if record.state == "standby":
            self._live.wake(record)
        return record

    def _woken(self, container_id: str) -> ContainerRecord:
        """The container's record, resuming it first if it is in standby: its next call wakes it."""
        record = self._started(container_id)
        if record.state == "standby":
            with self._locked(container_id):
                self._awake(self._record(container_id))
        return record

    def pause(self, container_id: str, memory: bool = True) -> None:
        """Freezes the container's processes (no CPU; memory and files kept), or under gVisor saves it to disk in
        standby; without `memory` it stops, keeping its files alone, and its resume starts it again over them."""
        with self._locked(container_id):
            record = self._started(container_id)
            if record.state != "running":
                return
            if not memory:
                self._live.set_aside(record)
            elif self.carries_memory(container_id):
                self._live.standby(record)
            else:
                self.cgroups.freeze(record.oci_id, True)
                record.state = "paused"
                self._lifecycle.save(record)

    def resume(self, container_id: str) -> None:
        with self._locked(container_id):
            record = self._awake(self._record(container_id))
            if record.state == "paused":
                self.cgroups.freeze(record.oci_id, False)
                record.state = "running"
                self._lifecycle.save(record)

    # -- commands and files -----------------------------------------------------------------

    def _agent_request(self, container_id: str, command: str | Sequence[str], **options: object
                       ) -> tuple[ContainerRecord, AgentRequest]:
        record = self._woken(container_id)
        self._file_clock.settle(container_id)
        request = agent_request(record, self.runtime(record.runtime), self.launcher.rootfs(record.id), command,
                                **options)  # type: ignore[arg-type]
        return record, request

    def exec(self, container_id: str, command: str | Sequence[str], *, timeout: float | None = None,
             env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None,
             stdin: bytes | str | None = None, output_limit: int | None = None, isolated: bool = False,
             on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None) -> ExecResult:
        """Runs a command (a shell string or an argv list) and returns when it ends or times out.

        `isolated` runs it in a throw-away copy of the container: it sees the container's files, but what it
        writes, its processes, IPC objects and sockets are its own and gone when it ends (runc only)."""
        record, request = self._agent_request(container_id, command, timeout=timeout, env=env, cwd=cwd, user=user,
                                              stdin=stdin, output_limit=output_limit, isolated=isolated)
        return self.launcher.agent_client(record).run(request, on_stdout, on_stderr)

    async def exec_async(self, container_id: str, command: str | Sequence[str], *, timeout: float | None = None,
                         env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None,
                         stdin: bytes | str | None = None, output_limit: int | None = None,
                         isolated: bool = False, on_stdout: OutputCallback | None = None,
                         on_stderr: OutputCallback | None = None) -> ExecResult:
        await self._file_clock.settle_async(container_id)  # before _agent_request's, which then waits for nothing
        record, request = self._agent_request(container_id, command, timeout=timeout, env=env, cwd=cwd, user=user,
                                              stdin=stdin, output_limit=output_limit, isolated=isolated)
        return await self.launcher.agent_client(record).run_async(request, on_stdout, on_stderr)

    def files(self, container_id: str) -> ContainerFiles:
        record = self._woken(container_id)
        files = ContainerFiles(str(self.launcher.rootfs(record.id)), record.home, record.uid, record.gid,
                               Limits(**record.limits).upload)
        files = volumes.MountedFiles(files, self.volumes, record.volumes) if record.volumes else files  # type: ignore[assignment]
        return self._file_clock.watch(record.id, files) if record.determinism else files  # type: ignore[return-value]

    def processes(self, container_id: str) -> ContainerProcesses:
        """The container's background processes, terminals and shell sessions."""
        record = self._started(container_id)
        return ContainerProcesses(self.launcher.agent_client(record),
                                  lambda command, **options: self._agent_request(container_id, command, **options)[1],
                                  record.limits["output"])

    def narrow_network(self, container_id: str, policy: Network) -> None:
        self.networks.narrow(self._record(container_id).id, policy)

    async def open_port(self, container_id: str, port: int) -> socket.socket:
        """See `Launcher.open_port`."""
        return await self.launcher.open_port(self._record(container_id), port)

    def stats(self, container_id: str) -> SandboxStats:
        return self.launcher.stats(self._started(container_id))

    def usage(self, container_id: str, *, cpu_only: bool = False) -> accounting.Usage:
        """The counters a claim's cost is accounted from (rollbox.node.cost); `cpu_only` reads one file."""
        record = self._record(container_id)
        return accounting.cpu_usage(self.cgroups, record) if cpu_only else \
            accounting.usage(self.cgroups, self.layers, record)

    # -- durability and clean-up ------------------------------------------------------------

    def recover(self) -> None:
        """Adopts the containers the store knows (starting again those that died) and removes everything of
        this engine it does not know."""
        self.volumes.recover()
        recovery.adopt(self._lifecycle)
        recovery.remove_orphans(self.launcher, list(self._records.values()), self.builder.work_dir)
        self._collection.collect_layers()
        self._collection.collect_checkpoints()
        if any(record.expires_at for record in self._records.values()):
            self._lifecycle.reaper.ensure()

    def delete_volume(self, key: str) -> None:
        """Deletes a volume once no container binds it (waiting a little for containers being deleted)."""
        self.volumes.delete(key, lambda: volumes.users(list(self._records.values()), key))

    def destroy_all(self) -> None:
        """Deletes every container and snapshot of this engine (templates and their layers stay)."""
        for record in list(self._records.values()):
            with contextlib.suppress(SandboxNotFound):
                self.delete(record.id)
        for name, *_ in self.store.snapshots():
            self.store.delete_snapshot(name)
        self._collection.collect_layers()
        self._collection.collect_checkpoints()
        self.cgroups.prune()

    def destroy(self) -> None:
        """Removes everything of this engine from the machine: containers, snapshots, and then any
        mount, cgroup or socket directory still left. The data directory keeps templates and layers."""
        self.destroy_all()
        self.close()
        for point in mounts.mounted_under(self.data_dir):
            mounts.umount(point, lazy=True)
        self.cgroups.remove_all()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def close(self) -> None:
        """Stops background work. Containers keep running, and a new engine on the same data adopts them;
        when none is left, the engine's run directory and cgroup parents go too, so that a stopped server
        leaves nothing on the machine outside its data directory."""
        self._lifecycle.reaper.stop()
        self.launcher.namespaces.close()
        self.store.close()
        self.images.close()
        if not self._records:
            self.volumes.unmount_all()
            self.cgroups.prune()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        self.volumes.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

