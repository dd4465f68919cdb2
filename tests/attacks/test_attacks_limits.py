"""Attacks on shared resources: fork bomb, memory bomb, disk fill, output flood, CPU hog, inotify.

Each must stop at the sandbox's own limit (cgroup pids, memory and CPU quota; the size of the
upper's tmpfs; the agent's output cap) while the neighbour keeps answering quickly and the host is
unharmed. Under runc only the offending processes die. gVisor (runsc) kills its whole sandbox when
a memory or pids limit is breached: there the test accepts that, and demands that `reset` brings
the sandbox back.
"""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rollbox.engine import Container, Engine
from rollbox.errors import SandboxNotRunning, TooLarge
from rollbox.models import ExecResult
from tests.attacks.attack_support import (
    LIMITS,
    Host,
    Neighbour,
    answers_or_resets,
    check_run_dir,
    host_free_bytes,
    new_sandbox,
    rss_bytes,
)
from tests.support.engines import cgroup_value

DIES_ON_LIMIT = {"runc": False, "runsc": True}
"""Whether breaching a memory or pids limit kills the whole sandbox (gVisor) or one process (runc)."""
NEIGHBOUR_P50_MS = {"runc": 50.0, "runsc": 250.0}
"""The neighbour's `true` must stay below this under attack (idle: ~2 ms under runc, ~30 ms under runsc)."""
HOST_PIDS = {"runc": LIMITS.pids, "runsc": LIMITS.pids * 16 + 256}
"""The host pids limit of a sandbox: gVisor's sentry threads and ptrace stubs need headroom."""
CPU_WINDOW = 1.5
"""Seconds over which a CPU hog's use is averaged: fifteen of the CFS quota's 100 ms periods."""


def _run_quietly(sandbox: Container, command: str, timeout: float, **options: object) -> ExecResult | None:
    """Runs an attack; None when it took the whole sandbox down with it."""
    try:
        return sandbox.exec(command, timeout=timeout, **options)  # type: ignore[arg-type]
    except SandboxNotRunning:
        return None


def test_fork_bomb(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host,
                   runtime_name: str) -> None:
    """A shell fork bomb must stop at the pids limit; the neighbour stays fast and the host can still fork."""
    assert int(cgroup_value(attack_engine, box, "pids", "pids.max")) == HOST_PIDS[runtime_name]
    baseline = neighbour.exec_p50_ms()
    bomb = "bomb() { bomb | bomb & }; bomb; sleep 6"
    with ThreadPoolExecutor(1) as pool:
        attack = pool.submit(_run_quietly, box, bomb, 6.0)
        time.sleep(1.5)
        during = neighbour.exec_p50_ms()
        peak = _read_int(attack_engine, box, "pids", "pids.current")
        result = attack.result(timeout=90)
    hits = _read_int(attack_engine, box, "pids", "pids.events")
    assert peak <= HOST_PIDS[runtime_name]
    assert hits > 0 or result is None or "fork" in result.stderr.lower(), \
        "the bomb never reached the pids limit: the attack did not happen"
    _assert_fast(during, baseline, runtime_name)
    assert subprocess.run(["true"], check=False).returncode == 0
    host.check()
    neighbour.check()
    assert answers_or_resets(box, runtime_name, may_die=DIES_ON_LIMIT[runtime_name])


def _read_int(engine: Engine, sandbox: Container, controller: str, name: str) -> int:
    """The last number in a cgroup file; 0 once the runtime removed the cgroup (a dead gVisor sandbox)."""
    try:
        return int(cgroup_value(engine, sandbox, controller, name).split()[-1])
    except FileNotFoundError:
        return 0


def _assert_fast(during: float, baseline: float, runtime: str) -> None:
    """The neighbour's p50 under attack stays below an absolute bound, or near its own p50 just before.

    The second bound keeps the test honest on a machine that other work already loads: a starved
    neighbour takes seconds, not a few times its idle latency.
    """
    bound = max(NEIGHBOUR_P50_MS[runtime], 4 * baseline)
    assert during < bound, f"neighbour p50 {during:.1f} ms under attack (before: {baseline:.1f} ms)"


def test_memory_bomb(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host,
                     runtime_name: str) -> None:
    """Allocating without end must stop at the memory limit and kill only the allocating process (runc)."""
    limit = int(cgroup_value(attack_engine, box, "memory", "memory.limit_in_bytes"))
    assert limit == LIMITS.memory + LIMITS.disk  # the upper's tmpfs is charged to the same cgroup
    agent_start = box.exec("cut -d' ' -f22 /proc/1/stat").stdout
    bomb = "python3 -c 'x = []\nwhile True: x.append(b\"x\" * (16 << 20))'"
    result = _run_quietly(box, bomb, 60.0)
    if runtime_name == "runc":
        assert result is not None and (result.exit_code, result.timed_out) == (137, False), result
        assert int(cgroup_value(attack_engine, box, "memory", "memory.max_usage_in_bytes")) <= limit
        # Only the bomb died: the agent (pid 1) is the same process and still runs commands.
        assert box.exec("cut -d' ' -f22 /proc/1/stat").stdout == agent_start
    else:
        assert result is None or result.exit_code != 0, result
    host.check()
    neighbour.check()
    assert answers_or_resets(box, runtime_name, may_die=DIES_ON_LIMIT[runtime_name])


def test_disk_fill(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host,
                   runtime_name: str) -> None:
    """Writing without end must fail with ENOSPC at the upper's size; the host's disk gets nothing."""
    free_before = host_free_bytes("/")
    fill = ("for target in /home/user/fill /tmp/fill /var/tmp/fill; do "
            "dd if=/dev/zero of=$target bs=1M count=2048 2>&1 | grep -o 'No space left on device'; done")
    result = box.exec(fill, timeout=120)
    assert result.stdout.count("No space left on device") == 3, result
    assert box.stats().disk_bytes <= LIMITS.disk
    # As root too, into every writable directory, the agent's socket directory included.
    root_fill = ("for dir in / /root /etc /.rollbox /.rollbox/run /dev/shm /run; do "
                 "dd if=/dev/zero of=$dir/fill bs=1M count=1024 2>/dev/null; done; echo done")
    assert box.exec(root_fill, user="root", timeout=120).stdout == "done\n"
    check_run_dir(attack_engine, box)
    # The agent's own stdout and stderr go to a log file on the host's disk: out of reach too.
    box.exec("for fd in 0 1 2; do dd if=/dev/zero of=/proc/1/fd/$fd bs=1M count=64; done", user="root")
    logs = attack_engine.launcher.bundle_dir / box.id
    assert all(log.stat().st_size < 2**20 for log in logs.glob("*.log")), "the sandbox wrote into the host's logs"
    assert host_free_bytes("/") > free_before - 2**30, "the host's disk filled up"
    with pytest.raises(TooLarge):
        box.files.write("/home/user/more", b"x" * 2**20)
    # /dev is a 64 MiB tmpfs under runc; under gVisor only the memory cgroup bounds it (the sandbox dies).
    dev_fill = "dd if=/dev/zero of=/dev/fill bs=1M count=1024 2>&1 | grep -o 'No space'"
    dev = _run_quietly(box, dev_fill, 60.0, user="root")
    assert dev is not None or DIES_ON_LIMIT[runtime_name]
    if runtime_name == "runc":
        assert dev is not None and dev.stdout == "No space\n", dev
    host.check()
    neighbour.check()
    assert answers_or_resets(box, runtime_name, may_die=DIES_ON_LIMIT[runtime_name])


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_flood(box: Container, neighbour: Neighbour, host: Host, runtime_name: str, stream: str) -> None:
    """A flood of output must be cut at the output cap and flagged, without the engine buffering it."""
    size = (256 if runtime_name == "runc" else 64) * 2**20  # gVisor's pipes are slower
    redirect = ">&2" if stream == "stderr" else ""
    samples = [rss_bytes()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            samples.append(rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = box.exec(f"head -c {size} /dev/zero {redirect}; echo end >&2", timeout=120)
    finally:
        done.set()
        sampler.join()
    assert (result.exit_code, result.timed_out) == (0, False), result
    flooded = getattr(result, stream)
    assert len(flooded) == LIMITS.output and set(flooded) == {"\0"}
    assert getattr(result, f"{stream}_truncated") is True
    assert max(samples) - samples[0] < 48 * 2**20, f"the engine grew by {(max(samples) - samples[0]) >> 20} MiB"
    small = box.exec(f"head -c {size // 16} /dev/zero {redirect}", output_limit=4096, timeout=120)
    assert len(getattr(small, stream)) == 4096 and getattr(small, f"{stream}_truncated")
    host.check()
    neighbour.check()


INOTIFY_HOG = """nohup python3 -c '
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
count = 0
while libc.inotify_init() >= 0:
    count += 1
print(count, flush=True)
time.sleep(600)' > /tmp/inotify.out 2>&1 &
for i in $(seq 100); do test -s /tmp/inotify.out && break; sleep 0.1; done; cat /tmp/inotify.out"""
INOTIFY_PROBE = "python3 -c 'import ctypes; print(ctypes.CDLL(None).inotify_init() >= 0)'"


def test_inotify_exhaustion(box: Container, neighbour: Neighbour, runtime_name: str,
                            request: pytest.FixtureRequest) -> None:
    """Taking every inotify instance must not starve the neighbour (file watchers, `tail -f`).

    Under runc this fails: the kernel counts inotify instances per uid, and every sandbox's user is
    uid 1000 of the host's user namespace, so one sandbox exhausts them for all (and for the host's
    uid 1000). gVisor keeps inotify inside its sentry. Closing it needs a uid (or a user namespace
    whose limits are not charged back to one shared uid) per sandbox: a known gap.
    """
    if runtime_name == "runc":
        request.applymarker(pytest.mark.xfail(strict=True, reason="per-uid kernel limits are shared (no userns)"))
    taken = box.exec(INOTIFY_HOG, timeout=60)
    try:
        assert int(taken.stdout) > 0, taken
        assert neighbour.sandbox.exec(INOTIFY_PROBE).stdout == "True\n", "the neighbour has no inotify left"
    finally:
        box.exec("pkill -f inotify_init; true")


def test_cpu_hog(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host, runtime_name: str) -> None:
    """Four busy loops must get at most their one core and leave the neighbour's commands fast."""
    assert cgroup_value(attack_engine, box, "cpu", "cpu.cfs_quota_us") == str(int(LIMITS.cpu * 100_000))
    baseline = neighbour.exec_p50_ms()
    with ThreadPoolExecutor(1) as pool:
        attack = pool.submit(box.exec, "for i in 1 2 3 4; do (while :; do :; done) & done; wait", timeout=6.0)
        time.sleep(1.0)
        used, started = box.stats().cpu_seconds, time.monotonic()
        during = neighbour.exec_p50_ms(25)
        # The quota is enforced per 100 ms period, which a shorter window can catch mid-burst on two cores.
        time.sleep(max(0.0, CPU_WINDOW - (time.monotonic() - started)))
        cores = (box.stats().cpu_seconds - used) / (time.monotonic() - started)
        result = attack.result(timeout=60)
    assert result.timed_out, result
    assert cores < LIMITS.cpu * 1.25, f"the hog used {cores:.2f} cores with a quota of {LIMITS.cpu}"
    _assert_fast(during, baseline, runtime_name)
    host.check()
    neighbour.check()
    assert answers_or_resets(box, runtime_name, may_die=False) == "alive"


def test_cpu_quota_throttles(attack_engine: Engine, runtime_name: str) -> None:
    """A sandbox limited to 200m must be throttled to it, however many loops it runs."""
    limits = LIMITS.model_copy(update={"cpu": 0.2})
    with new_sandbox(attack_engine, runtime_name, limits) as hog:
        throttled = _cpu_stat(attack_engine, hog)["nr_throttled"]
        with ThreadPoolExecutor(1) as pool:
            attack = pool.submit(hog.exec, "for i in 1 2 3 4; do (while :; do :; done) & done; wait", timeout=5.0)
            time.sleep(1.0)
            used, started = hog.stats().cpu_seconds, time.monotonic()
            time.sleep(2.5)
            cores = (hog.stats().cpu_seconds - used) / (time.monotonic() - started)
            attack.result(timeout=60)
        assert _cpu_stat(attack_engine, hog)["nr_throttled"] > throttled, "the quota never throttled the hog"
        assert cores < 0.2 * 1.3, f"the hog used {cores:.2f} cores with a quota of 0.2"


def _cpu_stat(engine: Engine, sandbox: Container) -> dict[str, int]:
    text = cgroup_value(engine, sandbox, "cpu", "cpu.stat")
    return {key: int(value) for key, value in (line.split() for line in text.splitlines())}
