"""Real engines on throw-away data directories, cleaned up to the last mount."""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from pathlib import Path

from rollbox.engine import Container, Engine
from rollbox.engine.engine import RUN_ROOT
from rollbox.engine.images.registry import RegistrySettings

BASIC = {"metadata": {"name": "basic"},
         "spec": {"steps": [{"run": "mkdir -p /opt/data && echo baseline > /opt/data/file"}]}}
RUNTIMES = ["runc", "runsc"]


def template_for(runtime: str) -> str:
    return "basic" if runtime == "runc" else f"basic-{runtime}"


def make_engine(root: Path, registries: RegistrySettings | None = None) -> Engine:
    return Engine(root / "data", run_dir=RUN_ROOT / f"test-{secrets.token_hex(4)}", registries=registries)


def run_dirs() -> set[str]:
    """What RUN_ROOT holds: engines' run directories (and the network lock)."""
    return set(os.listdir(RUN_ROOT)) if RUN_ROOT.is_dir() else set()


def _engine_cgroup_dirs(engine_id: str) -> list[Path]:
    """The cgroup directories of engine `engine_id` (`*`: of every engine): v2's, then v1's hierarchies."""
    return [path for pattern in (f"rollbox/{engine_id}", f"*/rollbox/{engine_id}")
            for path in Path("/sys/fs/cgroup").glob(pattern) if path.is_dir()]


def engine_cgroups() -> set[str]:
    """The engines that have cgroups on the machine: a deleted data directory's must not."""
    return {path.name for path in _engine_cgroup_dirs("*")}


def leftovers(data_dir: Path) -> list[str]:
    """What of the engine on `data_dir` is still on the machine: containers its runtimes know, its cgroups, its run
    directory. Read without opening the engine, which would make its run directory again."""
    with contextlib.closing(sqlite3.connect(data_dir / "state.db")) as db:
        (engine_id,) = db.execute("SELECT value FROM meta WHERE key='engine_id'").fetchone()
    containers = [str(path) for path in (data_dir / "runtime").glob("*/*")]
    cgroups = [str(path) for path in _engine_cgroup_dirs(engine_id)]
    run = [str(RUN_ROOT / engine_id)] if (RUN_ROOT / engine_id).exists() else []
    return containers + cgroups + run


def teardown_engine(engine: Engine) -> None:
    """Deletes everything the engine made on the machine."""
    engine.destroy()


_V2_NAMES = {"memory.limit_in_bytes": "memory.max", "memory.max_usage_in_bytes": "memory.peak",
             "memory.failcnt": "memory.events", "memory.usage_in_bytes": "memory.current", "cpuacct.usage": "cpu.stat"}


def cgroup_file(engine: Engine, container_id: str, controller: str, name: str) -> Path:
    """One file of the container's cgroup on the host (v1 names; mapped to v2 where the host has v2)."""
    record = engine.store.container(container_id)
    assert record is not None
    relative = engine.cgroups.path_for(record.oci_id).lstrip("/")
    if engine.cgroups.v2:
        return Path("/sys/fs/cgroup") / relative / _V2_NAMES.get(name, name)
    return Path("/sys/fs/cgroup") / controller / relative / name


def cgroup_value(engine: Engine, sandbox: Container, controller: str, name: str) -> str:
    return cgroup_file(engine, sandbox.id, controller, name).read_text().strip()
