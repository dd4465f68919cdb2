"""Deterministic sandboxes (docs/determinism.md): the same seed and the same commands give the same bytes.

The host's part: a sandbox's settings (its seed and the machine it says it runs on), the instant its clock starts
at, the /proc and /sys files it sees instead of the host's, how the exec agent is told (ROLLBOX_DETERMINISTIC at start,
the D frame later) and what it answers (Q), the seeds of a fork's children, and the template's digest that a
trajectory records. The agent's part is agent/det.c; the library preloaded into commands is agent/determinism.c.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rollbox.engine.oci import Bind
from rollbox.engine.store import ContainerRecord, Image
from rollbox.engine.volumes import WRITES
from rollbox.errors import InvalidRequest
from rollbox.spec import Limits, TemplateSpec

SECOND = 1_000_000_000
EPOCH = 1_704_067_200
"""2024-01-01T00:00:00Z: the seeds' clocks start within a year after this and 30 days."""
MAX_SEED = 2**63 - 1
CLOCK_REALTIME_COARSE = 5
"""The clock the kernel stamps files with (Python's time module does not name it)."""
_STATE = struct.Struct("<QqqqQII")
"""agent/det.h's struct det_state: seed, now, boot, born, fifo_pos, anchors, pad."""
PROC_FILES = ("meminfo", "cpuinfo", "stat", "uptime", "loadavg")
"""The /proc files a deterministic sandbox sees generated (runc lets these five be bound over, as LXCFS does)."""
CPU_ONLINE = "/sys/devices/system/cpu/online"
CPU_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
             "syscall nx lm constant_tsc rep_good nopl xtopology cpuid pni ssse3 cx16 sse4_1 sse4_2 popcnt "
             "hypervisor lahf_lm")


def settings(spec: TemplateSpec, limits: Limits, seed: int | None) -> dict[str, Any] | None:
    """What a container of `spec` records of its deterministic mode (None: it has none): on when the template asks
    for it or a seed is given; seed 0 when none is."""
    if not spec.deterministic and seed is None:
        return None
    machine = spec.machine
    return {"seed": check_seed(seed or 0), "kernel": machine.kernel, "cpus": machine.cpus or math.ceil(limits.cpu),
            "memory": machine.memory or limits.memory}


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InvalidRequest(f"a seed is an integer from 0 to {MAX_SEED}")
    return seed


def _hash(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big")


def start_of(seed: int) -> tuple[int, int]:
    """The instant (ns since 1970) the seed's clock starts at, and its boot instant: a whole second within a year
    after EPOCH + 30 days, up to an hour after boot."""
    start = EPOCH + 30 * 86400 + _hash("start", seed) % (365 * 86400)
    return start * SECOND, (start - 60 - _hash("uptime", seed) % 3600) * SECOND


def boot_id(seed: int) -> str:
    """/proc/sys/kernel/random/boot_id of the seed's machine (a version 4 UUID's form)."""
    return str(uuid.UUID(int=_hash("boot_id", seed) << 64 | _hash("boot_id", seed, 1), version=4))


def child_seed(parent: int, index: int) -> int:
    """The seed of a fork's `index`-th child (from 0): each its own, all given by the parent's."""
    return _hash("child", parent, index) & MAX_SEED


def template_digest(image: Image, determinism: dict[str, Any] | None) -> str:
    """What a trajectory records of the template an episode ran on: its layers (named by their content), settings
    and deterministic machine; the seed aside."""
    machine = {key: value for key, value in (determinism or {}).items() if key != "seed"}
    text = json.dumps({"image": asdict(image) | {"checkpoint": None}, "machine": machine}, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# -- the machine a sandbox sees ----------------------------------------------------------------------

def machine_files(determinism: dict[str, Any]) -> dict[str, str]:
    """The generated files, by name: the five of /proc (PROC_FILES) and the online CPUs."""
    cpus, kib = determinism["cpus"], determinism["memory"] // 1024
    start, boot = start_of(determinism["seed"])
    uptime = (start - boot) / SECOND
    free = kib * 3 // 4
    meminfo = {"MemTotal": kib, "MemFree": free, "MemAvailable": free, "Buffers": 0, "Cached": 0, "SwapCached": 0,
               "Active": kib - free, "Inactive": 0, "Unevictable": 0, "Mlocked": 0, "SwapTotal": 0, "SwapFree": 0,
               "Dirty": 0, "Writeback": 0, "AnonPages": kib - free, "Mapped": 0, "Shmem": 0, "KReclaimable": 0,
               "Slab": 0, "SReclaimable": 0, "SUnreclaim": 0, "KernelStack": 0, "PageTables": 0,
               "CommitLimit": kib, "Committed_AS": kib - free, "VmallocTotal": 0, "VmallocUsed": 0}
    cpuinfo = "".join(
        f"processor\t: {n}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: rollbox virtual "
        f"CPU\nstepping\t: 0\ncpu MHz\t\t: 2000.000\ncache size\t: 32768 KB\nphysical id\t: 0\nsiblings\t: {cpus}\n"
        f"core id\t\t: {n}\ncpu cores\t: {cpus}\napicid\t\t: {n}\nfpu\t\t: yes\nfpu_exception\t: yes\ncpuid level\t: "
        f"13\nwp\t\t: yes\nflags\t\t: {CPU_FLAGS}\nbogomips\t: 4000.00\naddress sizes\t: 46 bits physical, 48 bits "
        f"virtual\npower management:\n\n" for n in range(cpus))
    idle = round(uptime * 100)
    stat = "".join(f"cpu{n} 0 0 0 {idle} 0 0 0 0 0 0\n" for n in range(cpus))
    return {
        "meminfo": "".join(f"{key + ':':<16}{value:>8} kB\n" for key, value in meminfo.items()),
        "cpuinfo": cpuinfo,
        "stat": f"cpu  0 0 0 {idle * cpus} 0 0 0 0 0 0\n{stat}intr 0\nctxt 0\nbtime {boot // SECOND}\nprocesses 1\n"
                f"procs_running 1\nprocs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n",
        "uptime": f"{uptime:.2f} {uptime * cpus:.2f}\n",
        "loadavg": "0.00 0.00 0.00 1/1 1\n",
        "online": f"0-{cpus - 1}\n" if cpus > 1 else "0\n",
    }


def write_machine(directory: Path, determinism: dict[str, Any]) -> None:
    """Writes the files in place: a container that binds them sees the new text (a seed's boot time) at once."""
    directory.mkdir(exist_ok=True, mode=0o755)
    for name, text in machine_files(determinism).items():
        with open(directory / name, "w") as file:
            file.write(text)


def binds(directory: Path, library: Path) -> list[Bind]:
    """The container's binds of the generated files (written first, by `write_machine`) and of the library."""
    return [*(Bind(str(directory / name), f"/proc/{name}") for name in PROC_FILES),
            Bind(str(directory / "online"), CPU_ONLINE), Bind(str(library), "/.rollbox/determinism.so")]


def agent_setting(determinism: dict[str, Any], born: float) -> str:
    """The agent's environment variable that makes its sandbox deterministic: the seed's start, when the container
    was made (files stamped before it keep their times: the template's), the machine."""
    start, boot = start_of(determinism["seed"])
    born -= 2 * time.clock_getres(CLOCK_REALTIME_COARSE)  # the kernel stamps files up to a tick behind time.time()
    return (f"ROLLBOX_DETERMINISTIC={determinism['seed']},{start},{boot},{int(born * SECOND)},{determinism['cpus']},"
            f"{determinism['memory']},{determinism['kernel']}")


# -- the D and Q frames ------------------------------------------------------------------------------

def fresh_state(seed: int) -> bytes:
    """A D frame's payload that starts the seed's episode now: its clock at the seed's start, its streams at 0."""
    start, boot = start_of(seed)
    return _STATE.pack(seed, start, boot, 0, 0, 0, 0)


def continued_state(state: bytes, seed: int) -> bytes:
    """A D frame's payload that goes on from another sandbox's `state` (a Q answer: a fork's parent) with `seed`:
    the same clock and file times; the streams start over unless the seed is the state's own."""
    old_seed, now, boot, born, fifo_pos, count, _ = _STATE.unpack_from(state)
    return _STATE.pack(seed, now, boot, born, fifo_pos if seed == old_seed else 0, count, 0) + state[_STATE.size:]


class FileClock:
    """When the host last changed each deterministic container's files. The kernel stamps files with a clock that
    moves a tick at a time: a container's next command waits, if it comes within the tick of such a change, until
    that tick has passed, so that no file the host wrote is taken for the command's (what det_command_start does
    between commands). Waiting there rather than after each change costs a run of changes, and a command that
    comes a tick later, nothing."""

    def __init__(self) -> None:
        self._changed: dict[str, int] = {}

    def watch(self, container_id: str, files: Any) -> NotedFiles:
        return NotedFiles(files, lambda: self._note(container_id))

    def _note(self, container_id: str) -> None:
        now = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if len(self._changed) > 1024:  # containers written to and deleted without a command since
            self._changed = {key: at for key, at in self._changed.items() if at >= _file_clock()}
        self._changed[container_id] = now

    def settle(self, container_id: str) -> None:
        changed = self._changed.pop(container_id, 0)
        while _file_clock() <= changed:
            time.sleep(0.0002)

    async def settle_async(self, container_id: str) -> None:
        changed = self._changed.pop(container_id, 0)
        while _file_clock() <= changed:
            await asyncio.sleep(0.0002)


def _file_clock() -> int:
    return time.clock_gettime_ns(CLOCK_REALTIME_COARSE)


class NotedFiles:
    """A deterministic container's files API: each call that changes files tells `changed` (`FileClock`)."""

    def __init__(self, files: Any, changed: Callable[[], None]) -> None:
        self.files = files
        self.changed = changed

    def __getattr__(self, op: str) -> Any:
        call = getattr(self.files, op)
        if op not in WRITES:
            return call

        def noted(*args: Any, **options: Any) -> Any:
            try:
                return call(*args, **options)
            finally:
                self.changed()
        return noted


# -- the engine's calls -------------------------------------------------------------------------------

Reseed = Callable[[ContainerRecord, int, "bytes | None"], None]
"""`Launcher.reseed`: starts a container's episode at a seed's start, or goes on from a Q answer with a seed."""


def seed_fork(reseed: Reseed, parent: ContainerRecord, children: list[ContainerRecord], state: bytes) -> None:
    """After a fork: the parent goes on as it was (it may have started again), and each child goes on from the
    parent's clock and files with a seed of its own (`child_seed`), so that a group's members differ and every one
    of them is reproducible."""
    assert parent.determinism is not None
    seed = parent.determinism["seed"]
    reseed(parent, seed, state)
    for index, child in enumerate(children):
        reseed(child, child_seed(seed, index), state)
