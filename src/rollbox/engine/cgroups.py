"""The cgroups of one engine's sandboxes: freezing, statistics and clean-up.

Every engine keeps its sandboxes under `/rollbox/<engine-id>/` in each controller, so it never
touches cgroups it did not make (the process running the engine may sit in a cgroup of its own).
Works with cgroup v1 (one hierarchy per controller) and v2 (one unified hierarchy).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "freezer", "devices", "blkio",
                  "net_cls", "net_prio", "hugetlb", "perf_event", "rdma", "misc", "systemd",
                  "unified")
"""Every v1 hierarchy a runtime may make a directory in; `unified` is the v2 one of a hybrid layout."""


def is_v2() -> bool:
    return (ROOT / "cgroup.controllers").exists()


class Cgroups:
    def __init__(self, engine_id: str) -> None:
        self.parent = f"/rollbox/{engine_id}"
        self.v2 = is_v2()

    def path_for(self, name: str) -> str:
        """The cgroupsPath the OCI runtime is told for one container."""
        return f"{self.parent}/{name}"

    def _dir(self, controller: str, name: str) -> Path:
        relative = self.path_for(name).lstrip("/")
        return ROOT / relative if self.v2 else ROOT / controller / relative

    def freeze(self, name: str, frozen: bool, timeout: float = 5.0) -> None:
        if self.v2:
            path = self._dir("", name)
            (path / "cgroup.freeze").write_text("1" if frozen else "0")
            want = "frozen 1" if frozen else "frozen 0"
            check = path / "cgroup.events"
        else:
            path = self._dir("freezer", name)
            (path / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
            want = "FROZEN" if frozen else "THAWED"
            check = path / "freezer.state"
        deadline = time.monotonic() + timeout
        while want not in check.read_text():
            if time.monotonic() > deadline:
                raise TimeoutError(f"cgroup {name} did not become {want}")
            time.sleep(0.0002)

    def is_frozen(self, name: str) -> bool:
        try:
            if self.v2:
                return "frozen 1" in (self._dir("", name) / "cgroup.events").read_text()
            return (self._dir("freezer", name) / "freezer.state").read_text().strip() != "THAWED"
        except OSError:
            return False

    def _read_int(self, controller: str, name: str, filename: str) -> int:
        try:
            return int((self._dir(controller, name) / filename).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def memory(self, name: str) -> tuple[int, int]:
        """Current and peak memory in bytes."""
        if self.v2:
            return (self._read_int("", name, "memory.current"), self._read_int("", name, "memory.peak"))
        return (self._read_int("memory", name, "memory.usage_in_bytes"),
                self._read_int("memory", name, "memory.max_usage_in_bytes"))

    def memory_current(self, name: str) -> int:
        """Memory in use now, in bytes: one read, for sampling a claim's cost."""
        if self.v2:
            return self._read_int("", name, "memory.current")
        return self._read_int("memory", name, "memory.usage_in_bytes")

    def cpu_seconds(self, name: str) -> float:
        if self.v2:
            try:
                for line in (self._dir("", name) / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec"):
                        return int(line.split()[1]) / 1e6
            except OSError:
                return 0.0
            return 0.0
        return self._read_int("cpuacct", name, "cpuacct.usage") / 1e9

    def pids(self, name: str) -> int:
        return self._read_int("" if self.v2 else "pids", name, "pids.current")

    def oom_kills(self, name: str) -> int:
        """How many processes the memory limit has killed (v2), or how often it was hit (v1)."""
        try:
            if self.v2:
                text = (self._dir("", name) / "memory.events").read_text()
                return next((int(line.split()[1]) for line in text.splitlines()
                             if line.startswith("oom_kill ")), 0)
            return self._read_int("memory", name, "memory.failcnt")
        except OSError:
            return 0

    def existing(self) -> set[str]:
        """Names of the container cgroups this engine has on the machine."""
        base = ROOT / self.parent.lstrip("/") if self.v2 else ROOT / "pids" / self.parent.lstrip("/")
        with contextlib.suppress(OSError):
            return {entry.name for entry in base.iterdir() if entry.is_dir()}
        return set()

    def remove(self, name: str) -> None:
        """Removes one container's cgroups (the runtime usually did already)."""
        for directory in self._all_dirs(self.path_for(name)):
            _rmdir_tree(directory)

    def prune(self) -> None:
        """Removes this engine's own directories where they are empty: a data directory deleted after
        its sandboxes leaves nothing in the hierarchy, and a sandbox made later makes them again."""
        for directory in self._all_dirs(self.parent):
            with contextlib.suppress(OSError):
                os.rmdir(directory)

    def remove_all(self) -> None:
        for directory in self._all_dirs(self.parent):
            _rmdir_tree(directory)

    def _all_dirs(self, cgroup_path: str) -> list[Path]:
        relative = cgroup_path.lstrip("/")
        if self.v2:
            return [ROOT / relative]
        return [ROOT / controller / relative for controller in V1_CONTROLLERS]


def _rmdir_tree(directory: Path) -> None:
    if not directory.is_dir():
        return
    for child in directory.iterdir():
        if child.is_dir():
            _rmdir_tree(child)
    for _ in range(50):
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            _kill_members(directory)
            time.sleep(0.02)


def _kill_members(directory: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (directory / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)
