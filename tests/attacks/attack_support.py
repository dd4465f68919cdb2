"""What the attack suite's modules share beyond its fixtures (`conftest.py`): the evidence and its checks.

Every attack runs under each runtime (runc and gVisor's runsc) in a sandbox with small limits, next
to a neighbour sandbox, and ends by checking concrete evidence that the host and the neighbour are
unharmed: canary files on the host with the same content, host files with the same hash, the
neighbour's files and processes still there and its commands still answering.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rollbox.engine import Container, Engine
from rollbox.errors import SandboxNotFound, SandboxNotRunning
from rollbox.models import ExecResult
from rollbox.spec import Limits

RUNTIMES = ("runc", "runsc")
LIMITS = Limits(cpu=1, memory="256Mi", disk="128Mi", pids=128)
"""Small limits, so that bombs reach them in a second or two."""
BASELINE = "baseline\n"
HOST_FILES = ("/etc/passwd", "/etc/shadow", "/etc/group", "/etc/hostname", "/etc/hosts",
              "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/kernel/sysrq")
"""Host files an attack could aim at: their hashes must not change."""


def template_name(runtime: str) -> str:
    return f"attack-{runtime}"


@contextlib.contextmanager
def new_sandbox(engine: Engine, runtime: str, limits: Limits = LIMITS) -> Iterator[Container]:
    box = engine.create(template_name(runtime), limits=limits)
    try:
        yield box
    finally:
        with contextlib.suppress(SandboxNotFound):
            box.delete()


@dataclass
class Neighbour:
    """A sandbox beside the attacker, with a file and a background process that must survive."""

    sandbox: Container
    token: str
    pid: int

    def check(self) -> None:
        result = self.sandbox.exec(f"cat /home/user/canary && kill -0 {self.pid} && echo running", timeout=30)
        assert (result.exit_code, result.stdout) == (0, f"{self.token}\nrunning\n"), result

    def exec_p50_ms(self, count: int = 15) -> float:
        return exec_p50_ms(self.sandbox, count)


@dataclass
class Host:
    """Evidence about the host: canary files outside every sandbox and hashes of sensitive host files."""

    engine: Engine
    directory: Path
    """A host directory (mode 0700) holding `secret`: no sandbox may read or change it, nor add files."""
    secret: bytes
    root_canary: Path
    """A file in the host's /root."""
    hashes: dict[str, str] = field(default_factory=dict)
    usr_bin: set[str] = field(default_factory=set)
    """What the host's /usr/bin held at the start: all of it must still be there (installs may add)."""

    @property
    def secret_file(self) -> Path:
        return self.directory / "secret"

    def check(self) -> None:
        assert self.secret_file.read_bytes() == self.secret
        assert sorted(os.listdir(self.directory)) == ["secret", "victim"]
        assert (self.directory / "victim").read_bytes() == b"victim\n"
        assert self.root_canary.read_bytes() == self.secret
        assert host_hashes() == self.hashes
        assert self.usr_bin <= set(os.listdir("/usr/bin")), "files vanished from the host's /usr/bin"
        assert self.engine.launcher.agent.is_file() and os.access(self.engine.launcher.agent, os.X_OK)
        assert os.system("true") == 0, "the host cannot start processes"


def host_hashes() -> dict[str, str]:
    found = {}
    for name in HOST_FILES:
        with contextlib.suppress(OSError):
            found[name] = hashlib.sha256(Path(name).read_bytes()).hexdigest()
    return found


def exec_p50_ms(sandbox: Container, count: int = 15) -> float:
    """The median time, in milliseconds, of running `true` in a sandbox."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        result = sandbox.exec(["true"], timeout=30)
        times.append((time.perf_counter() - started) * 1000)
        assert result.exit_code == 0, result
    return statistics.median(times)


def answers_or_resets(sandbox: Container, runtime: str, may_die: bool) -> str:
    """Checks the attacked sandbox still runs commands, or (where allowed) that reset brings it back.

    Returns "alive" or "reset". After a reset the sandbox must be back at its template's files.
    """
    try:
        result = sandbox.exec("cat /opt/data/file", timeout=30)
        if result.exit_code == 0:
            return "alive"
    except SandboxNotRunning:
        if not may_die:
            raise
    sandbox.reset()
    result = sandbox.exec("cat /opt/data/file", timeout=30)
    assert (result.exit_code, result.stdout) == (0, BASELINE), result
    return "reset"


def failed(result: ExecResult) -> bool:
    return result.exit_code not in (0, None)


def host_free_bytes(path: str = "/") -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def rss_bytes() -> int:
    """Resident memory of this process (the engine runs in it)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def check_run_dir(engine: Engine, sandbox: Container) -> None:
    """The sandbox's run directory on the host holds what the engine put there and nothing more: its agent's
    socket and, where it has one, the boot id its sandbox reads (unchanged: a UUID and a newline)."""
    run_dir = engine.run_dir / sandbox.id
    own_boot_id = engine.runtime(sandbox.info.runtime).own_boot_id
    assert sorted(os.listdir(run_dir)) == ["agent.sock", *(["boot_id"] if own_boot_id else [])], \
        "the sandbox wrote into the host's run directory"
    if own_boot_id:
        assert len((run_dir / "boot_id").read_text()) == 37
