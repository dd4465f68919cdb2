"""Checkpoint images: a gVisor container's processes and memory, saved on disk to be restored later.

A live fork saves its parent once and restores the image into every child (and into the parent, which
the save stops); a snapshot with memory keeps its image for as long as it, or a container started from
it, exists; a container in standby keeps one until it resumes. Each image is a directory
`checkpoints/<id>` of the data directory. Images count against the disk limit of the container they
save and against a budget for the whole engine; whatever the store does not name (a save cut short by
a crash, a deleted snapshot's) is removed by `collect`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rollbox.engine.launcher import Launcher
from rollbox.engine.layers import UPPER_PREFIX
from rollbox.engine.store import ContainerRecord, Image
from rollbox.errors import CapacityExceeded, RestoreFailed

DEFAULT_BUDGET = 64 * 2**30
"""Bytes all of an engine's images may take together unless it is given a budget."""


class Checkpoints:
    """One engine's checkpoint images. Thread-safe."""

    def __init__(self, data_dir: Path, launcher: Launcher, budget: int | None = None) -> None:
        self.root = data_dir / "checkpoints"
        self.root.mkdir(exist_ok=True, mode=0o700)
        self.launcher = launcher
        self.budget = DEFAULT_BUDGET if budget is None else budget
        self._lock = threading.Lock()
        self._in_use: set[str] = set()
        """Images being written or restored that the store does not name yet (a fork's): `collect` spares them."""

    def path(self, image_id: str) -> Path:
        return self.root / image_id

    def size(self, image_id: str) -> int:
        """Bytes the image takes on disk."""
        return sum(entry.stat().st_blocks * 512 for entry in os.scandir(self.path(image_id)) if entry.is_file())

    def snapshot_bytes(self, image: Image) -> int:
        """Bytes a snapshot holds of its own: its files (the frozen upper on top) and its checkpoint image."""
        layers = self.launcher.layers
        top = image.layers[0] if image.layers and image.layers[0].startswith(UPPER_PREFIX) else None
        files = layers.upper_bytes(top) if top and layers.exists(top) else 0
        with contextlib.suppress(OSError):
            files += self.size(image.checkpoint) if image.checkpoint else 0
        return files

    def used(self) -> int:
        return sum(self.size(entry.name) for entry in os.scandir(self.root) if entry.is_dir())

    @contextmanager
    def saving(self, record: ContainerRecord) -> Iterator[str]:
        """Saves the container into a new image and yields its id. The container has stopped: the caller
        restores it (or others) from the image, which `collect` spares while the block runs."""
        image_id = "c-" + secrets.token_hex(8)
        with self._lock:
            self._in_use.add(image_id)
        try:
            self.path(image_id).mkdir(mode=0o700)
            try:
                self.launcher.checkpoint(record, self.path(image_id))
            except BaseException:
                self.remove(image_id)
                raise
            yield image_id
        finally:
            with self._lock:
                self._in_use.discard(image_id)

    def check_room(self, image_id: str, disk_room: int) -> None:
        """Refuses an image larger than `disk_room` or one that takes the engine past its budget."""
        size = self.size(image_id)
        if size > disk_room:
            raise CapacityExceeded(f"the sandbox's processes and memory take {size} bytes saved, more than the "
                                   f"{disk_room} bytes left of its disk limit: raise the limit or free memory")
        if self.used() > self.budget:
            raise CapacityExceeded(f"checkpoint images would take more than this node's budget of {self.budget} "
                                   "bytes: delete snapshots with memory or resume sandboxes in standby")

    def restorable(self, image_id: str) -> Path:
        """The image's directory, or RestoreFailed if it is missing."""
        path = self.path(image_id)
        if not (path / "checkpoint.img").is_file():
            raise RestoreFailed(f"checkpoint image {image_id} is missing: reset the sandbox, or delete the "
                                "snapshot and take it again")
        return path

    def remove(self, image_id: str) -> None:
        shutil.rmtree(self.path(image_id), ignore_errors=True)

    def collect(self, referenced: set[str]) -> None:
        """Removes every image neither `referenced` (by the store) nor being written or restored."""
        with self._lock:
            keep = referenced | self._in_use
            for entry in os.scandir(self.root):
                if entry.name not in keep:
                    shutil.rmtree(entry.path, ignore_errors=True)
