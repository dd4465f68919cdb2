"""OCI runtimes by name: runc (default), runsc (gVisor), and any runc-compatible CLI (crun, kata).

Each engine gives every runtime its own state root, so two engines on one machine never see each
other's containers. Containers start detached with stdout and stderr going to a log file: a pipe
would be held open by the container's init and hang the caller.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.engine.oci import COMPAT_PATH, SANDBOX_ROOT, Bind
from rollbox.engine.seccomp import AGENT_FILTERED, EPERM
from rollbox.errors import RuntimeUnavailable

AGENT_FD = 3


@dataclass
class Runtime:
    """A runc-compatible CLI. The agent's listening socket is passed to the container as fd 3."""

    name: str
    binary: str
    state_root: Path
    global_flags: list[str] = field(default_factory=list)
    passes_fds: bool = True
    """False where the runtime cannot hand the socket in: the agent then listens on a bound path."""
    exec_env: dict[str, str] = field(default_factory=dict)
    """Environment every command gets under this runtime."""
    joins_netns: bool = True
    """Whether containers' sockets are the kernel's, in a network namespace: then a container can join a prepared
    namespace (how an egress allowlist reaches it), and the host can open its ports from inside its namespace."""
    isolates_commands: bool = True
    """Whether the agent can run isolated commands (user namespaces and overlay mounts inside the sandbox)."""
    own_boot_id: bool = True
    """Whether each container gets a boot id of its own (`oci.ContainerConfig.proc_binds`, a hook in the
    container's mount namespace): the host's would tell sandboxes of other tenants on the same machine apart."""

    def _base(self) -> list[str]:
        return [self.binary, "--root", str(self.state_root), *self.global_flags]

    def binds(self, rootfs: Path) -> list[Bind]:
        """Extra binds this runtime needs: the sandbox's own root, which isolated commands overlay."""
        return [Bind(str(rootfs), SANDBOX_ROOT, recursive=False)]

    def adjust(self, spec: dict[str, Any]) -> None:
        """Adapts a container spec to this runtime's quirks (in place)."""

    checkpoints: bool = False
    """Whether the runtime can save a running container's processes and memory to an image and restore it."""

    def start(self, oci_id: str, bundle: Path, listener_fd: int | None, log: Path,
              checkpoint: Path | None = None) -> None:
        """Starts the container, or with `checkpoint`, restores the processes saved in that image into it."""
        run = self._run_args(bundle, listener_fd) if checkpoint is None else self._restore_args(bundle, checkpoint)
        argv = [*self._base(), "--log", str(log.with_suffix(".runtime.log")), *run, oci_id]
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        if listener_fd is not None:
            actions.append((os.POSIX_SPAWN_DUP2, listener_fd, AGENT_FD))
        pid = os.posix_spawn(self.binary, argv, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                             file_actions=actions)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            detail = _tail(log) + _tail(log.with_suffix(".runtime.log"))
            raise RuntimeUnavailable(f"{self.name} could not start container {oci_id}: {detail.strip()}")

    def _run_args(self, bundle: Path, listener_fd: int | None) -> list[str]:
        extra = ["--preserve-fds", "1"] if listener_fd is not None else []
        return ["run", "--detach", *extra, "--bundle", str(bundle)]

    def _restore_args(self, bundle: Path, checkpoint: Path) -> list[str]:
        raise RuntimeUnavailable(f"runtime {self.name!r} cannot restore a checkpoint")

    def checkpoint(self, oci_id: str, image: Path, log: Path) -> None:
        """Saves the container's processes, memory and open files into the directory `image`; the container
        stops."""
        raise RuntimeUnavailable(f"runtime {self.name!r} cannot checkpoint a container")

    def run_to_end(self, oci_id: str, bundle: Path, log: Path, timeout: float) -> int:
        """Runs a container in the foreground (a build step) and returns its exit code."""
        argv = [*self._base(), "run", "--bundle", str(bundle), oci_id]
        with open(log, "ab") as out:
            try:
                return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                self.delete(oci_id)
                return -1

    def delete(self, oci_id: str) -> None:
        """Once the init is gone, what `runc delete` still does for a stopped container is to remove its
        cgroups (the engine does) and its state directory: done here, that saves a runc process per
        delete. Anything else falls back to the runtime's own `delete --force`."""
        if self._kill_init(oci_id):
            shutil.rmtree(self.state_root / oci_id, ignore_errors=True)
        else:
            subprocess.run([*self._base(), "delete", "--force", oci_id], capture_output=True, check=False)

    def _kill_init(self, oci_id: str, timeout: float = 5.0) -> bool:
        """Kills the container's init (and so its whole pid namespace); True once it has exited.

        `runc delete --force` (1.1) kills a running container and then polls it every 100 ms, which a
        pidfd saves every delete. Runtimes that keep no runc `state.json` get False: they delete themselves.
        """
        try:
            pidfd = self.init_pidfd(oci_id)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        if pidfd is None:
            return False
        try:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return _exited(pidfd, timeout)
        finally:
            os.close(pidfd)

    def init_pidfd(self, oci_id: str) -> int | None:
        """A pidfd of the process whose exit means the container stopped (readable from then on); the
        caller closes it. None when this runtime does not say which process that is; ProcessLookupError
        when it has exited already."""
        init = self._init_process(oci_id)
        return None if init is None else _open_pidfd(*init)

    def _init_process(self, oci_id: str) -> tuple[int, int] | None:
        """The init's pid and start time from runc's `state.json`: the start time guards against a reused pid."""
        try:
            state = json.loads((self.state_root / oci_id / "state.json").read_text())
            return int(state["init_process_pid"]), int(state["init_process_start"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def state(self, oci_id: str) -> dict[str, Any] | None:
        result = subprocess.run([*self._base(), "state", oci_id], capture_output=True, text=True)
        if result.returncode != 0:
            return None
        return json.loads(result.stdout)

    def list(self) -> list[str]:
        if not self.state_root.exists():
            return []
        result = subprocess.run([*self._base(), "list", "--format", "json"], capture_output=True, text=True)
        if result.returncode != 0 or not result.stdout.strip():
            return []
        return [entry["id"] for entry in json.loads(result.stdout) or []]


@dataclass
class Runsc(Runtime):
    """gVisor. Its Debian build spells flags `-detach` and `-bundle`, and runs on ptrace here."""

    def _run_args(self, bundle: Path, listener_fd: int | None) -> list[str]:
        return ["run", "-detach", "-bundle", str(bundle)]

    checkpoints: bool = True
    own_boot_id: bool = False
    """This gVisor's /proc has no sys/kernel/random: no host's boot id shows through."""

    def _restore_args(self, bundle: Path, checkpoint: Path) -> list[str]:
        return ["restore", "-detach", "-bundle", str(bundle), "-image-path", str(checkpoint)]

    def checkpoint(self, oci_id: str, image: Path, log: Path) -> None:
        # Not -leave-running: this release restores the container under the same id to do that, and hangs.
        argv = [*self._base(), "--log", str(log.with_suffix(".runtime.log")), "checkpoint", "-image-path",
                str(image), oci_id]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            detail = result.stderr.strip().splitlines()
            raise RuntimeUnavailable(f"{self.name} could not checkpoint container {oci_id}: "
                                     f"{detail[0] if detail else 'no detail'}")
        # The sandbox has exited: what is left of it is its state files, and `runsc state` on them takes seconds.
        for path in self.state_root.glob(f"{glob.escape(oci_id)}_sandbox:*"):
            path.unlink(missing_ok=True)

    def adjust(self, spec: dict[str, Any]) -> None:
        # The sentry's threads and the ptrace platform's stub processes count against the host pids
        # cgroup: leave them room, or a few concurrent commands would kill the whole sandbox.
        pids = spec["linux"]["resources"]["pids"]
        pids["limit"] = pids["limit"] * 16 + 256
        # This release ignores errnoRet and fails every filtered call with EPERM: a rule meant to
        # answer ENOSYS (clone3, so libc falls back to clone) would break thread creation.
        seccomp = spec["linux"]["seccomp"]
        seccomp["syscalls"] = [rule for rule in seccomp["syscalls"] if rule.get("errnoRet", EPERM) == EPERM]
        # No isolated commands here (this gVisor cannot mount an overlay in a user namespace): keep the
        # calls they need denied to the agent too.
        seccomp["syscalls"].append({"names": AGENT_FILTERED, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM})


    def binds(self, rootfs: Path) -> list[Bind]:
        """/tmp only: without a mount at /tmp, gVisor puts a private tmpfs there that the host cannot see."""
        tmp = rootfs / "tmp"
        if not tmp.is_dir():
            tmp.mkdir()
            tmp.chmod(0o1777)
        return [Bind(str(tmp), "/tmp", readonly=False)]

    def delete(self, oci_id: str) -> None:
        # Kill the sandbox and gofer processes ourselves and wait until they are gone: `runsc delete`
        # alone takes seconds and returns while the gofer, which holds the root filesystem in its own
        # mount namespace, still runs (and an upper must be free before fork reuses it as a lower).
        # Its state files are then cleaned in the background (a restarted engine removes leftovers).
        bundle = self._bundle(oci_id)
        if bundle:
            _wait_for_processes_mentioning(bundle, str(self.state_root))
        argv = [*self._base(), "delete", "-force", oci_id]
        threading.Thread(target=subprocess.run, args=(argv,), kwargs={"capture_output": True}, daemon=True).start()

    def init_pidfd(self, oci_id: str) -> int | None:
        """The sandbox process (the sentry) stands for the container: it runs as long as the container does."""
        try:
            path = next(self.state_root.glob(f"{glob.escape(oci_id)}_sandbox:*.state"))
            pid = int(json.loads(path.read_text())["sandbox"]["pid"])
        except (StopIteration, OSError, ValueError, KeyError, TypeError):
            return None
        pidfd = _open_pidfd(pid, None)
        if f"--root={self.state_root}" not in _cmdline(pid):  # the sandbox exited and its pid was reused
            os.close(pidfd)
            raise ProcessLookupError(pid)
        return pidfd

    def _bundle(self, oci_id: str) -> str | None:
        state = self.state(oci_id)
        return state.get("bundle") if state else None

    def list(self) -> list[str]:
        if not self.state_root.exists():
            return []
        result = subprocess.run([*self._base(), "list", "-quiet"], capture_output=True, text=True)
        return result.stdout.split() if result.returncode == 0 else []


def make_runtime(name: str, state_dir: Path) -> Runtime:
    """The runtime called `name`, with its state kept under `state_dir`."""
    binary = shutil.which(name)
    if binary is None:
        raise RuntimeUnavailable(
            f"runtime {name!r} is not installed: install it (apt-get install {name}) or choose "
            "'runc' in the template's spec.runtime"
        )
    root = state_dir / name
    root.mkdir(parents=True, exist_ok=True)
    if name == "runsc":
        flags = ["--platform=ptrace", "--network=none", "--host-uds=all", "--file-access=shared", "--oci-seccomp"]
        # This release's `--network=sandbox` takes any namespace whose /proc/sys/net/core/rmem_default
        # exists for the host's own, and on recent kernels (6.18 here) every namespace has it.
        return Runsc(name, binary, root, flags, passes_fds=False, exec_env={"LD_PRELOAD": COMPAT_PATH},
                     joins_netns=False, isolates_commands=False)
    return Runtime(name, binary, root)


def _open_pidfd(pid: int, started: int | None) -> int:
    """A pidfd of `pid`, if that process still runs and (given `started`) is the one that started then;
    else ProcessLookupError. The start time is compared after opening: the pidfd pins the process it names."""
    pidfd = os.pidfd_open(pid)
    if started is not None and _start_time(pid) != started:
        os.close(pidfd)
        raise ProcessLookupError(pid)
    return pidfd


def _exited(pidfd: int, timeout: float) -> bool:
    """Waits for a pidfd to turn readable. poll, not select: a node's descriptors go past select's 1024."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def _wait_for_processes_mentioning(bundle: str, root: str, timeout: float = 5.0) -> None:
    """Kills every process that names both `root` and `bundle` on its command line, and waits until they are gone."""
    deadline = time.monotonic() + timeout
    while True:
        found = [pid for pid, cmdline in _processes() if root in cmdline and bundle in cmdline]
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeUnavailable(f"processes {found} did not exit after the sandbox was deleted")
        time.sleep(0.01)


def _processes() -> list[tuple[int, str]]:
    return [(int(entry.name), _cmdline(int(entry.name))) for entry in os.scandir("/proc") if entry.name.isdigit()]


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""
