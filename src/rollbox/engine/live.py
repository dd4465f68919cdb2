"""Fork, snapshot and standby that carry a gVisor container's processes and memory, not only its files.

Each saves the container once into a checkpoint image (`checkpoints`), which stops it, and restores
from that image: a fork into the parent and every child, each over an upper of its own above the
parent's frozen upper (the same layering as the file-only fork); a snapshot into the source, keeping
the image for the containers started from the snapshot; standby only later, on resume, over the
container's own upper. A saved container is always restored, even when its image is refused for its
size, so that no operation loses a container's processes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rollbox.engine import volumes
from rollbox.engine.lifecycle import Lifecycle
from rollbox.engine.store import ContainerRecord
from rollbox.errors import CapacityExceeded, RestoreFailed, RuntimeUnavailable
from rollbox.spec import Limits

RESTORE_WORKERS = 8


class Live:
    """The engine's operations on a container's processes and memory (callers hold the container's lock). `delete`
    is the engine's, for the children of a fork that failed."""

    def __init__(self, lifecycle: Lifecycle, delete: Callable[[str], None]) -> None:
        self.lifecycle = lifecycle
        self.checkpoints = lifecycle.checkpoints
        self.delete = delete

    @contextlib.contextmanager
    def _saving(self, record: ContainerRecord) -> Iterator[str]:
        """`checkpoints.saving`; a container that runsc failed to save (it stops anyway) is started again over its
        files, so that the sandbox loses its processes and memory, never itself."""
        saved = False
        try:
            with self.checkpoints.saving(record) as image_id:
                saved = True
                yield image_id
        except RuntimeUnavailable as error:
            if saved:
                raise
            self.lifecycle.restart(record)
            raise RuntimeUnavailable(f"{error}; the sandbox was started again over its files, without its "
                                     "processes") from None

    def fork(self, parent: ContainerRecord, count: int) -> list[ContainerRecord]:
        """Restores `count` children and the parent from one checkpoint of the parent."""
        lifecycle = self.lifecycle
        with self._saving(parent) as image_id:
            self._check_room(parent, image_id)
            # Accounts are resolved over the image the parent started from, as the file-only fork does: what
            # the parent wrote in /etc/passwd since is the tenant's.
            children = [lifecycle.new_record(parent.template, parent.runtime, parent.image, Limits(**parent.limits),
                                             parent.env, parent.labels) for _ in range(count)]
            image = lifecycle.freeze_upper(parent)
            for child in children:
                child.image, child.baseline, child.parent, child.snapshot = (image, parent.baseline, parent.id,
                                                                             parent.snapshot)
                child.volumes, child.determinism = volumes.read_only(parent.volumes), parent.determinism
            with ThreadPoolExecutor(max_workers=min(count + 1, RESTORE_WORKERS)) as pool:
                restores = [pool.submit(self._restore, parent, image_id),
                            *(pool.submit(lifecycle.launch, child, None, image_id) for child in children)]
                errors = [error for error in (f.exception() for f in restores) if error]
            if errors:
                for child in children:
                    with contextlib.suppress(Exception):
                        self.delete(child.id)
                self.checkpoints.remove(image_id)
                raise errors[0]
        self.checkpoints.remove(image_id)
        return children

    def snapshot(self, record: ContainerRecord, name: str) -> float:
        """Saves the container's files and processes under `name`, and restores it to go on; returns when it was
        taken. The image of a snapshot this one replaced is left for the caller to collect."""
        lifecycle = self.lifecycle
        with self._saving(record) as image_id:
            self._check_room(record, image_id)
            image = lifecycle.freeze_upper(record)
            now = time.time()
            lifecycle.store.put_snapshot(name, record.template, replace(image, checkpoint=image_id), record.id, now)
            self._restore(record, image_id)
        return now

    def _restore(self, record: ContainerRecord, image_id: str) -> None:
        """Restores a saved container under its id, over a new upper above its frozen files. Should runsc refuse
        the image, the container is started again over those files: it loses its processes and memory, never
        itself."""
        try:
            self.lifecycle.launch(record, None, image_id, keep=True)
        except (RestoreFailed, RuntimeUnavailable) as error:
            self.lifecycle.relaunch(record)
            raise RestoreFailed(f"{error}; the sandbox was started again over its files, without its processes"
                                ) from None

    def standby(self, record: ContainerRecord) -> None:
        """Saves the container to disk and stops it: it holds no memory until `wake`."""
        lifecycle = self.lifecycle
        with self._saving(record) as image_id:
            record.checkpoint, record.state = image_id, "standby"
            lifecycle.save(record)
            try:
                self._check_room(record, image_id)
            except CapacityExceeded:
                self.wake(record)
                raise
            lifecycle.launcher.stop(record)

    def set_aside(self, record: ContainerRecord) -> None:
        """Stops the container and keeps its files alone (a pause without memory, any runtime): `wake` starts it
        again over them, its processes afresh."""
        self.lifecycle.launcher.stop(record)
        record.checkpoint, record.state = None, "standby"
        self.lifecycle.save(record)

    def wake(self, record: ContainerRecord) -> None:
        """Restores a container in standby over its own files, under its id; its image then goes. One set aside
        without its memory starts again over its files."""
        lifecycle = self.lifecycle
        image_id = record.checkpoint
        if image_id is None:
            lifecycle.restart(record)
            return
        lifecycle.launcher.stop(record)  # what a save left of the container on the machine
        record.generation += 1
        record.state = "running"
        lifecycle.save(record)
        try:
            lifecycle.start(record, self.checkpoints.restorable(image_id))
        except (RuntimeUnavailable, RestoreFailed) as error:
            lifecycle.stopped(record)
            raise _restore_failed(image_id, error) from None
        finally:
            record.checkpoint = None
            lifecycle.save(record)
            self.checkpoints.remove(image_id)

    def _check_room(self, record: ContainerRecord, image_id: str) -> None:
        """Refuses an image past the container's disk limit (with what it wrote) or the engine's budget; the
        container is restored first, over its own files, as it was."""
        lifecycle = self.lifecycle
        room = Limits(**record.limits).disk - lifecycle.layers.upper_bytes(record.upper)
        try:
            self.checkpoints.check_room(image_id, room)
        except CapacityExceeded:
            if record.state != "standby":
                lifecycle.launcher.stop(record)
                record.generation += 1
                lifecycle.save(record)
                lifecycle.start(record, self.checkpoints.path(image_id))
                self.checkpoints.remove(image_id)
            raise


def _restore_failed(image_id: str, error: Exception) -> RestoreFailed:
    if isinstance(error, RestoreFailed):
        return error
    return RestoreFailed(f"checkpoint image {image_id} could not be restored (corrupt, or written by another "
                         f"runtime version): {error}; nothing of the restore is left, reset the sandbox")
