"""What a restarted engine checks: which recorded containers still run, and what nobody recorded.

The engine records a container before it touches the machine and forgets it only after removing it,
so after a crash the store names everything the engine may have made. A recorded container that
died is started again over its files; whatever of this engine the store does not name is removed.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from rollbox.engine.launcher import Launcher
from rollbox.engine.layers import remove_tree
from rollbox.engine.lifecycle import Lifecycle
from rollbox.engine.store import ContainerRecord
from rollbox.errors import SandboxNotRunning


def adopt(lifecycle: Lifecycle) -> None:
    """Reads the store's records again and starts each container that died again over its files (one that fails to
    start stays, `stopped`, for a reset); one whose files are gone is removed."""
    for record in lifecycle.reload():
        if record.state == "stopped":
            continue
        try:
            running = still_running(lifecycle.launcher, record)
        except Exception:
            with contextlib.suppress(Exception):
                lifecycle.destroy(record)
            continue
        if not running:
            with contextlib.suppress(Exception):
                lifecycle.restart(record)


def still_running(launcher: Launcher, record: ContainerRecord) -> bool:
    """Whether the container runs as recorded (a paused one counts); False when it died and can start again
    over its files. SandboxNotRunning when its files are gone too."""
    upper, _ = launcher.layers.upper_dirs(record.upper)
    if not upper.is_dir() or any(not launcher.layers.exists(layer) for layer in record.image.layers):
        raise SandboxNotRunning("lost its files (was the machine restarted?)", container_id=record.id)
    if record.state == "paused" and launcher.cgroups.is_frozen(record.oci_id):
        return True
    if record.state == "standby":  # on disk, resumed on its next call (a missing image fails then, clearly)
        return True
    return launcher.agent_client(record).ping()


def remove_orphans(launcher: Launcher, keep: list[ContainerRecord], build_dir: Path) -> None:
    """Removes every container, cgroup, network, bundle and socket directory of this engine that none of
    `keep` owns (what a crash left between making a container and recording it, or the reverse), and what
    builds and layer imports left half-done in `build_dir` and the layer store."""
    oci_ids = {record.oci_id for record in keep}
    ids = {record.id for record in keep}
    for runtime_dir in (launcher.data_dir / "runtime").glob("*"):
        runtime = launcher.runtime(runtime_dir.name)
        for found in runtime.list():
            if found not in oci_ids:
                runtime.delete(found)
    for name in launcher.cgroups.existing():
        if name not in oci_ids:
            launcher.cgroups.remove(name)
    for directory in launcher.bundle_dir.iterdir():
        if directory.name not in ids:
            remove_tree(directory)
    launcher.networks.remove_orphans(ids)
    for directory in launcher.run_dir.iterdir():
        if directory.name not in ids:
            shutil.rmtree(directory, ignore_errors=True)
    for leftover in build_dir.iterdir():
        remove_tree(leftover)
    for partial in launcher.layers.layers.glob(".partial-*"):
        remove_tree(partial)
