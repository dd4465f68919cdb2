"""Durability: an engine killed with SIGKILL is restarted, adopts its sandboxes, removes orphans.
And deleting sandboxes leaves nothing behind: mounts, cgroups, runtime state and directories counted."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from rollbox.engine import Engine, mounts
from rollbox.engine.cgroups import ROOT as CGROUP_ROOT
from rollbox.engine.cgroups import is_v2
from tests.support.engines import cgroup_value, make_engine, teardown_engine

HOLDER = textwrap.dedent("""
    import json, sys, time
    from rollbox.engine import Engine
    from rollbox.spec import SandboxTemplate
    from tests.support.engines import BASIC
    engine = Engine(sys.argv[1], run_dir=sys.argv[2])
    engine.build(SandboxTemplate.model_validate(BASIC))
    served = engine.create("basic")
    served.exec("echo kept > f")
    (child,) = served.fork(1)
    served.exec("python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &")
    paused = engine.create("basic")
    paused.exec("echo paused-state > f")
    paused.pause()
    crashed = engine.create("basic")
    crashed.exec("echo survives-a-crash > f")
    unknown = engine.create("basic")
    print(json.dumps({"served": served.id, "paused": paused.id, "crashed": crashed.id, "child": child.id,
                      "unknown": unknown.id, "engine": engine.id}), flush=True)
    time.sleep(600)
""")

FETCH = ("python3 -c \"import urllib.request,time\nfor _ in range(100):\n"
         "  try: print(urllib.request.urlopen('http://127.0.0.1:8000/').status); break\n"
         "  except OSError: time.sleep(0.05)\"")


def footprint(engine: Engine) -> dict[str, object]:
    """Everything of this engine on the machine that a leak would show up in."""
    hierarchies = [""] if is_v2() else ["pids", "memory", "freezer", "unified"]
    cgroup_dirs = [CGROUP_ROOT / name / engine.cgroups.parent.lstrip("/") for name in hierarchies]
    return {
        "mounts": sorted(mounts.mounted_under(engine.data_dir)),
        "cgroups": sorted(f"{d.parent.parent.name}/{p.name}" for d in cgroup_dirs if d.exists()
                          for p in d.iterdir() if p.is_dir()),
        "containers": sorted(c for name in ("runc",) for c in engine.runtime(name).list()),
        "bundle_dirs": sorted(p.name for p in engine.launcher.bundle_dir.iterdir()),
        "run_dirs": sorted(p.name for p in engine.run_dir.iterdir()),
        "uppers": sorted(p for p in engine.layers.all_ids() if p.startswith("u-")),
    }


def test_sigkilled_engine_is_adopted_and_orphans_removed(tmp_path: Path) -> None:
    data, run = tmp_path / "data", f"/run/rollbox/test-durable-{os.getpid()}"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(data), run], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[2])
    try:
        ids = json.loads(holder.stdout.readline())
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    # What a crash can leave behind: a sandbox the store never recorded, a stray mount and cgroup.
    with sqlite3.connect(data / "state.db") as db:
        db.execute("DELETE FROM sandboxes WHERE id=?", (ids["unknown"],))
    stray_mount = data / "sandboxes" / "stray"
    stray_mount.mkdir()
    mounts.mount_tmpfs(stray_mount, 1 << 20)
    stray_cgroup = CGROUP_ROOT / ("" if is_v2() else "pids") / "rollbox" / ids["engine"] / "stray.0"
    stray_cgroup.mkdir(parents=True)
    # And a sandbox whose container died while no engine watched.
    subprocess.run(["runc", "--root", str(data / "runtime" / "runc"), "kill", f"{ids['crashed']}.0", "KILL"],
                   check=True)

    engine = Engine(data, run_dir=run)
    try:
        assert engine.id == ids["engine"]
        served = engine.get(ids["served"])
        assert served.exec("cat f").stdout == "kept\n"
        assert served.exec(FETCH, timeout=20).stdout.strip() == "200", "adopted, not restarted: its server runs"
        paused = engine.get(ids["paused"])
        assert paused.info.state == "paused"
        paused.resume()
        assert paused.exec("cat f").stdout == "paused-state\n"
        assert engine.get(ids["crashed"]).exec("cat f").stdout == "survives-a-crash\n"
        assert engine.get(ids["child"]).exec("cat f").stdout == "kept\n"

        left = footprint(engine)
        assert not any(ids["unknown"] in str(item) for item in left.values()), left
        assert not stray_mount.exists() and not stray_cgroup.exists()
        assert len(left["containers"]) == 4
    finally:
        teardown_engine(engine)


def test_delete_leaves_nothing_behind(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    try:
        from rollbox.spec import SandboxTemplate
        from tests.support.engines import BASIC

        engine.build(SandboxTemplate.model_validate(BASIC))
        before = footprint(engine)
        boxes = [engine.create("basic") for _ in range(3)]
        boxes[0].exec("echo x > x")
        boxes += boxes[0].fork(2)
        boxes[1].snapshot("snap")
        boxes.append(engine.create(snapshot="snap"))
        boxes[2].pause()
        boxes[3].reset()
        assert footprint(engine) != before
        for box in boxes:
            box.delete()
        engine.delete_snapshot("snap")
        assert footprint(engine) == before
    finally:
        teardown_engine(engine)


SECOND_ENGINE = "import sys; from rollbox.engine import Engine; Engine(sys.argv[1], run_dir=sys.argv[2])"


def test_a_second_engine_on_a_live_data_directory_fails_before_touching_it(engine: Engine, tmp_path: Path) -> None:
    """Two servers started on one data directory by mistake: the second's recovery would restart or remove
    sandboxes the first runs (here one whose container was killed, which the first leaves stopped until a
    reset). It fails at once instead, and the first's sandbox stays as it was."""
    box = engine.create("basic")
    try:
        for pid in cgroup_value(engine, box, "pids", "cgroup.procs").split():
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not engine.stopped(box.id):
            assert time.monotonic() < deadline, "the killed sandbox did not stop"
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-c", SECOND_ENGINE, str(engine.data_dir), str(tmp_path / "run")],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stderr[-2000:]
        assert "state.db is in use by another rollbox process" in second.stderr
        assert engine.stopped(box.id), "the second engine restarted the first one's sandbox"
    finally:
        box.delete()
