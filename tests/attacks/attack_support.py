"""Shared fixtures of the attack suite (`tests/test_attacks_*.py`).

Every attack runs under each runtime (runc and gVisor's runsc) in a sandbox with small limits, next
to a neighbour sandbox, and ends by checking concrete evidence that the host and the neighbour are
unharmed: canary files on the host with the same content, host files with the same hash, the
neighbour's files and processes still there and its commands still answering.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rollbox.engine import Engine, Sandbox
from rollbox.errors import SandboxNotFound, SandboxNotRunning
from rollbox.models import ExecResult
from rollbox.spec import Limits, SandboxTemplate
from tests.conftest import make_engine, teardown_engine

RUNTIMES = ("runc", "runsc")
LIMITS = Limits(cpu=1, memory="256Mi", disk="128Mi", pids=128)
"""Small limits, so that bombs reach them in a second or two."""
BASELINE = "baseline\n"
HOST_FILES = ("/etc/passwd", "/etc/shadow", "/etc/group", "/etc/hostname", "/etc/hosts",
              "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/kernel/sysrq")
"""Host files an attack could aim at: their hashes must not change."""


def template_name(runtime: str) -> str:
    return f"attack-{runtime}"


@pytest.fixture(scope="session")
def attack_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine for the attack suite, with the same small template built for each installed runtime."""
    engine = make_engine(tmp_path_factory.mktemp("attacks"))
    for runtime in RUNTIMES:
        if shutil.which(runtime):
            engine.build(SandboxTemplate.model_validate({
                "metadata": {"name": template_name(runtime)},
                "spec": {"runtime": runtime, "limits": LIMITS.model_dump(),
                         "steps": [{"run": f"mkdir -p /opt/data && printf '{BASELINE}' > /opt/data/file"}]},
            }))
    yield engine
    teardown_engine(engine)


@pytest.fixture(scope="session", params=[pytest.param("runc", id="runc"),
                                         pytest.param("runsc", id="runsc", marks=pytest.mark.runsc)])
def runtime_name(request: pytest.FixtureRequest) -> str:
    if shutil.which(request.param) is None:
        pytest.skip(f"{request.param} is not installed")
    return request.param


@contextlib.contextmanager
def new_sandbox(engine: Engine, runtime: str, limits: Limits = LIMITS) -> Iterator[Sandbox]:
    box = engine.create(template_name(runtime), limits=limits)
    try:
        yield box
    finally:
        with contextlib.suppress(SandboxNotFound):
            box.delete()


@pytest.fixture
def box(attack_engine: Engine, runtime_name: str) -> Iterator[Sandbox]:
    """The attacker's sandbox."""
    with new_sandbox(attack_engine, runtime_name) as sandbox:
        yield sandbox


@dataclass
class Neighbour:
    """A sandbox beside the attacker, with a file and a background process that must survive."""

    sandbox: Sandbox
    token: str
    pid: int

    def check(self) -> None:
        result = self.sandbox.exec(f"cat /home/user/canary && kill -0 {self.pid} && echo running", timeout=30)
        assert (result.exit_code, result.stdout) == (0, f"{self.token}\nrunning\n"), result

    def exec_p50_ms(self, count: int = 15) -> float:
        return exec_p50_ms(self.sandbox, count)


@pytest.fixture(scope="session")
def neighbour(attack_engine: Engine, runtime_name: str) -> Iterator[Neighbour]:
    """One neighbour per runtime for the whole suite: every attack checks it at its end."""
    with new_sandbox(attack_engine, runtime_name) as sandbox:
        token = secrets.token_hex(8)
        result = sandbox.exec(f"echo {token} > /home/user/canary && (nohup sleep 100000 >/dev/null 2>&1 & echo $!)")
        assert result.exit_code == 0, result
        yield Neighbour(sandbox, token, int(result.stdout))


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
        assert _hashes() == self.hashes
        assert self.usr_bin <= set(os.listdir("/usr/bin")), "files vanished from the host's /usr/bin"
        assert self.engine.agent.is_file() and os.access(self.engine.agent, os.X_OK)
        assert os.system("true") == 0, "the host cannot start processes"


def _hashes() -> dict[str, str]:
    found = {}
    for name in HOST_FILES:
        with contextlib.suppress(OSError):
            found[name] = hashlib.sha256(Path(name).read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="session")
def host(attack_engine: Engine) -> Iterator[Host]:
    directory = Path(tempfile.mkdtemp(prefix="rollbox-attack-", dir="/tmp"))
    secret = f"host secret {secrets.token_hex(16)}\n".encode()
    (directory / "secret").write_bytes(secret)
    (directory / "victim").write_bytes(b"victim\n")
    root_canary = Path("/root") / f".rollbox-attack-{secrets.token_hex(6)}"
    root_canary.write_bytes(secret)
    evidence = Host(attack_engine, directory, secret, root_canary, _hashes(), set(os.listdir("/usr/bin")))
    try:
        yield evidence
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        root_canary.unlink(missing_ok=True)


def exec_p50_ms(sandbox: Sandbox, count: int = 15) -> float:
    """The median time, in milliseconds, of running `true` in a sandbox."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        result = sandbox.exec(["true"], timeout=30)
        times.append((time.perf_counter() - started) * 1000)
        assert result.exit_code == 0, result
    return statistics.median(times)


def answers_or_resets(sandbox: Sandbox, runtime: str, may_die: bool) -> str:
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


_V2_NAMES = {"memory.limit_in_bytes": "memory.max", "memory.max_usage_in_bytes": "memory.peak",
             "memory.failcnt": "memory.events"}


def cgroup_value(engine: Engine, sandbox: Sandbox, controller: str, name: str) -> str:
    """One file of the sandbox's cgroup on the host (v1 names; mapped to v2 where the host has v2)."""
    record = engine.store.sandbox(sandbox.id)
    assert record is not None
    relative = engine.cgroups.path_for(record.container_id).lstrip("/")
    if engine.cgroups.v2:
        return (Path("/sys/fs/cgroup") / relative / _V2_NAMES.get(name, name)).read_text().strip()
    return (Path("/sys/fs/cgroup") / controller / relative / name).read_text().strip()


def host_free_bytes(path: str = "/") -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def rss_bytes() -> int:
    """Resident memory of this process (the engine runs in it)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
