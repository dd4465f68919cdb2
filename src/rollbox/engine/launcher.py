"""Puts a container on the machine and takes it off again.

Starting one mounts its overlay root, writes its OCI bundle, joins its network, and starts the runtime
with the exec agent as init, listening on a socket the host made (or, where the runtime cannot pass a
descriptor in, one the agent binds in a directory the host shares). Stopping leaves its upper, so a
restart continues over the same files; removing takes everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

from rollbox.engine import determinism, mounts, volumes
from rollbox.engine.agent import determinism_library
from rollbox.engine.agent_client import AgentClient
from rollbox.engine.cgroups import Cgroups
from rollbox.engine.files import ContainerFiles
from rollbox.engine.hostbase import host_binds
from rollbox.engine.layers import SKELETON, LayerStore, remove_tree
from rollbox.engine.netns import Namespaces
from rollbox.engine.network import Networks
from rollbox.engine.oci import AGENT_PATH, AGENT_SOCKET_DIR, COMPAT_PATH, Bind, ContainerConfig, container_spec
from rollbox.engine.ports import Ports
from rollbox.engine.runtimes import AGENT_FD, Runtime, make_runtime
from rollbox.engine.store import ContainerRecord
from rollbox.errors import Conflict, InvalidRequest, RuntimeUnavailable, SandboxNotRunning
from rollbox.models import SandboxStats
from rollbox.spec import Limits, Network

LOCKOUT_ID = 2147483646
"""Who owns a container's socket directory (agent.h's LOCKOUT_ID): commands are locked out of it."""
HOLD_TIMEOUT = 5.0
"""Seconds the agent has to close its socket before a checkpoint."""
ACCOUNTS_FILES = ("/etc/passwd", "/etc/group")
"""What the OCI runtime reads in a container's root to start it."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"


class Launcher:
    """Everything of one engine's containers on the machine: bundles, runtimes, cgroups, networks, sockets."""

    def __init__(self, data_dir: Path, run_dir: Path, layers: LayerStore, cgroups: Cgroups, networks: Networks,
                 agent: Path, compat: Path) -> None:
        self.data_dir = data_dir
        self.run_dir = run_dir
        """Each container's agent socket and network lease, in `<container id>/`."""
        self.bundle_dir = data_dir / "sandboxes"
        """Each container's OCI bundle and root mount, in `<container id>/` (named so since the first release:
        renaming it would orphan the mounts of running containers)."""
        self.bundle_dir.mkdir(exist_ok=True)
        self.layers = layers
        self.cgroups = cgroups
        self.networks = networks
        self.agent = agent
        self.compat = compat
        self.determinism = determinism_library(data_dir / "bin")
        self.namespaces = Namespaces()
        self.ports = Ports(self.namespaces)
        self._runtimes: dict[str, Runtime] = {}
        self._lock = threading.Lock()

    def runtime(self, name: str) -> Runtime:
        with self._lock:
            if name not in self._runtimes:
                self._runtimes[name] = make_runtime(name, self.data_dir / "runtime")
            return self._runtimes[name]

    def rootfs(self, container_id: str) -> Path:
        return self.bundle_dir / container_id / "rootfs"

    def agent_client(self, record: ContainerRecord) -> AgentClient:
        return AgentClient(str(self.run_dir / record.id / "agent.sock"), record.id)

    def start(self, record: ContainerRecord, network: Network, checkpoint: Path | None = None) -> None:
        """Mounts the container's root filesystem, starts it (or restores the processes saved in `checkpoint`
        into it), and waits until its agent answers."""
        runtime = self.runtime(record.runtime)
        bundle = self.bundle_dir / record.id
        rootfs = self.rootfs(record.id)
        rootfs.mkdir(parents=True, exist_ok=True)
        upper, work = self.layers.upper_dirs(record.upper)
        if not os.path.ismount(rootfs):  # an overlay has its own device: no scan of a mount table that grows
            lowers = self.layers.stack_paths([SKELETON, *record.image.layers])
            mounts.mount_overlay(rootfs, lowers, upper, work)
        run = self.run_dir / record.id
        run.mkdir(exist_ok=True, mode=0o700)
        netns = self.networks.ensure(record.id, network)
        binds, env = [Bind(str(self.agent), AGENT_PATH), *runtime.binds(rootfs)], []
        if record.image.host_binds:
            binds += host_binds()
        binds += volumes.binds(self.data_dir, record.volumes)
        if runtime.passes_fds:
            args = [AGENT_PATH, "--fd", str(AGENT_FD)]
        else:
            binds.append(Bind(str(run), AGENT_SOCKET_DIR, readonly=False))
            args = [AGENT_PATH, "--path", f"{AGENT_SOCKET_DIR}/agent.sock"]
        if runtime.exec_env:
            binds.append(Bind(str(self.compat), COMPAT_PATH))
        if record.determinism:
            determinism.write_machine(run / "machine", record.determinism)
            binds += determinism.binds(run / "machine", self.determinism)
            env.append(determinism.agent_setting(record.determinism, record.created_at))
        proc_binds = []
        if runtime.own_boot_id:
            _write_boot_id(run / "boot_id", record)
            proc_binds.append(Bind(str(run / "boot_id"), str(rootfs / BOOT_ID.lstrip("/"))))
        limits = Limits(**record.limits)
        spec = container_spec(ContainerConfig(
            args=args, cgroups_path=self.cgroups.path_for(record.oci_id), limits=limits, binds=binds, env=env,
            disk_in_memory=limits.disk, netns=str(netns) if netns else None, proc_binds=proc_binds))
        runtime.adjust(spec)
        (bundle / "config.json").write_text(json.dumps(spec))
        socket_path = run / "agent.sock"
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        listener = None
        if checkpoint is not None:
            os.chown(run, LOCKOUT_ID, LOCKOUT_ID)  # the restored agent gave up taking its directory back
        elif runtime.passes_fds:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(socket_path))
            listener.listen(512)
        try:
            runtime.start(record.oci_id, bundle, listener.fileno() if listener else None, bundle / "agent.log",
                          checkpoint)
        finally:
            if listener:
                listener.close()
        self.agent_client(record).wait_ready()

    def reseed(self, record: ContainerRecord, seed: int, state: bytes | None = None) -> None:
        """Starts a deterministic container's episode again at `seed`'s start, or (given a Q answer's `state`) goes on
        from that state's clock and file times with `seed`'s streams (engine/determinism.py). The caller saves the
        record."""
        if record.determinism is None:
            raise InvalidRequest(f"container {record.id} is not deterministic: it was not created with a seed, nor "
                                 "from a template with spec.deterministic")
        record.determinism = {**record.determinism, "seed": determinism.check_seed(seed)}
        determinism.write_machine(self.run_dir / record.id / "machine", record.determinism)
        if self.runtime(record.runtime).own_boot_id:
            _write_boot_id(self.run_dir / record.id / "boot_id", record)
        self.agent_client(record).exchange(
            b"D", determinism.continued_state(state, seed) if state else determinism.fresh_state(seed))

    def determinism_state(self, record: ContainerRecord) -> bytes | None:
        """A deterministic container's clock, streams and file times (the agent's Q answer); None for another."""
        return self.agent_client(record).exchange(b"Q") if record.determinism else None

    def checkpoint(self, record: ContainerRecord, image: Path) -> None:
        """Saves the container's processes and memory into the directory `image`; the container stops.

        The agent's socket is bound to a host path, which gVisor cannot save: the agent closes it first and
        waits (agent.c's hold()) while the hold file exists; that file is gone by the time this returns."""
        runtime = self.runtime(record.runtime)
        if not runtime.checkpoints:
            raise RuntimeUnavailable(f"runtime {record.runtime!r} cannot checkpoint a container")
        socket_path = self.run_dir / record.id / "agent.sock"
        hold = socket_path.with_name(socket_path.name + ".hold")
        hold.touch()
        try:
            self.agent_client(record).hold()
            deadline = time.monotonic() + HOLD_TIMEOUT
            while socket_path.exists():
                if time.monotonic() > deadline:
                    raise SandboxNotRunning("did not let go of its agent's socket", container_id=record.id)
                time.sleep(0.001)
            runtime.checkpoint(record.oci_id, image, self.bundle_dir / record.id / "agent.log")
        finally:
            hold.unlink()

    def check_startable(self, record: ContainerRecord, operation: str) -> None:
        """Refuses an `operation` that would start the container again (or others over its files) where the
        runtime could not: it reads the accounts files in the root to start one, and fails on anything but a file
        there. Checked before the container stops, so that nothing of it is lost."""
        files = ContainerFiles(str(self.rootfs(record.id)), record.home, record.uid, record.gid, 0)
        for path in ACCOUNTS_FILES:
            if files.kind(path) not in (None, "file"):
                raise Conflict(f"the sandbox's {path} is not a file, so it could not be started again for a "
                               f"{operation}: make it a file again (or remove it), or reset the sandbox")

    def stop(self, record: ContainerRecord) -> None:
        """Kills the container and unmounts its root filesystem; the upper stays."""
        self.runtime(record.runtime).delete(record.oci_id)
        self.cgroups.remove(record.oci_id)
        mounts.umount(self.rootfs(record.id))

    def remove(self, record: ContainerRecord) -> None:
        """Stops the container and removes its upper, network, bundle and socket directory."""
        self.stop(record)
        self.networks.release(record.id)
        if record.upper:
            self.layers.remove(record.upper)
        remove_tree(self.bundle_dir / record.id)
        shutil.rmtree(self.run_dir / record.id, ignore_errors=True)

    def stats(self, record: ContainerRecord) -> SandboxStats:
        """What the container uses now: its cgroup's memory, CPU and processes, and its upper's disk."""
        name = record.oci_id
        memory, peak = self.cgroups.memory(name)
        usage = os.statvfs(self.layers.upper_dirs(record.upper)[0])
        return SandboxStats(memory_bytes=memory, memory_peak_bytes=peak, cpu_seconds=self.cgroups.cpu_seconds(name),
                            pids=self.cgroups.pids(name), disk_bytes=(usage.f_blocks - usage.f_bfree) * usage.f_frsize)

    def exit_fd(self, record: ContainerRecord) -> int | None:
        """A descriptor that turns readable once the container has stopped (a pidfd of its init), so that one
        epoll can watch thousands; the caller closes it. None when its runtime does not say which process
        that is; SandboxNotRunning when it has stopped already."""
        try:
            return self.runtime(record.runtime).init_pidfd(record.oci_id)
        except ProcessLookupError:
            raise SandboxNotRunning("has stopped: reset it or start a new one", container_id=record.id) from None

    async def open_port(self, record: ContainerRecord, port: int) -> socket.socket:
        """A connected socket to `port` on the loopback of a running container (resume a paused one first)."""
        return await self.ports.open(self.runtime(record.runtime), record.oci_id, self.agent_client(record), port)

    def listen(self, record: ContainerRecord, host: str, port: int) -> socket.socket:
        """A socket of this process listening on (host, port) inside the container's network (`netns.py`)."""
        if not self.runtime(record.runtime).joins_netns:
            raise InvalidRequest(f"runtime {record.runtime} keeps the sandbox's network inside its own kernel, where "
                                 "no address of the host's can be put: use a runc template for this")
        pidfd = self.exit_fd(record)
        if pidfd is None:
            raise RuntimeUnavailable(f"runtime {record.runtime} does not say which process is container "
                                     f"{record.id}'s init")
        try:
            return self.namespaces.listen(pidfd, host, port)
        finally:
            os.close(pidfd)

    def stopped(self, record: ContainerRecord) -> bool:
        """Whether the container has stopped, told by its init's pidfd: no round trip to the agent, so a
        listing can ask it of every container. False when the runtime cannot tell (see exit_fd)."""
        try:
            fd = self.exit_fd(record)
        except SandboxNotRunning:
            return True
        if fd is None:
            return False
        try:
            return bool(select.select([fd], [], [], 0)[0])  # a pidfd turns readable once its process exits
        finally:
            os.close(fd)


def _write_boot_id(path: Path, record: ContainerRecord) -> None:
    """A container's boot id: new at each start (a sandbox paused without its memory boots again), or its seed's.
    Written in place, so that a bind of the file shows a new seed's at once."""
    with open(path, "w") as file:
        file.write(f"{determinism.boot_id(record.determinism['seed']) if record.determinism else uuid.uuid4()}\n")
