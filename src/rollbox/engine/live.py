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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from rollbox.engine import volumes
from rollbox.engine.store import ContainerRecord
from rollbox.errors import CapacityExceeded, RestoreFailed, RuntimeUnavailable
from rollbox.models import SnapshotInfo
from rollbox.spec import Limits

if TYPE_CHECKING:
    from rollbox.engine.engine import Engine

RESTORE_WORKERS = 8


class Live:
    """The engine's operations on a container's processes and memory (callers hold the container's lock)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextlib.contextmanager
    def _saving(self, record: ContainerRecord) -> Iterator[str]:
        """`checkpoints.saving`; a container that runsc failed to save (it stops anyway) is started again over its
        files, so that the sandbox loses its processes and memory, never itself."""
        saved = False
        try:
            with self.engine.checkpoints.saving(record) as image_id:
                saved = True
                yield image_id
        except RuntimeUnavailable as error:
            if saved:
                raise
            self.engine._restart(record)
            raise RuntimeUnavailable(f"{error}; the sandbox was started again over its files, without its "
                                     "processes") from None

    def fork(self, parent: ContainerRecord, count: int) -> list[ContainerRecord]:
        """Restores `count` children and the parent from one checkpoint of the parent."""
        engine = self.engine
        with self._saving(parent) as image_id:
            self._check_room(parent, image_id)
            # Accounts are resolved over the image the parent started from, as the file-only fork does: what
            # the parent wrote in /etc/passwd since is the tenant's.
            children = [engine._new_record(parent.template, parent.runtime, parent.image, Limits(**parent.limits),
                                           parent.env, parent.labels) for _ in range(count)]
            image = engine._freeze_upper(parent)
            for child in children:
                child.image, child.baseline, child.parent, child.snapshot = (image, parent.baseline, parent.id,
                                                                             parent.snapshot)
                child.volumes = volumes.read_only(parent.volumes)
            with ThreadPoolExecutor(max_workers=min(count + 1, RESTORE_WORKERS)) as pool:
                restores = [pool.submit(self._restore, parent, image_id),
                            *(pool.submit(engine._launch, child, None, image_id) for child in children)]
                errors = [error for error in (f.exception() for f in restores) if error]
            if errors:
                for child in children:
                    with contextlib.suppress(Exception):
                        engine.delete(child.id)
                engine.checkpoints.remove(image_id)
                raise errors[0]
        engine.checkpoints.remove(image_id)
        return children

    def snapshot(self, record: ContainerRecord, name: str) -> SnapshotInfo:
        """Saves the container's files and processes under `name`, and restores it to go on."""
        engine = self.engine
        with self._saving(record) as image_id:
            self._check_room(record, image_id)
            image = engine._freeze_upper(record)
            now = time.time()
            engine.store.put_snapshot(name, record.template, replace(image, checkpoint=image_id), record.id, now)
            self._restore(record, image_id)
        engine.collect_checkpoints()  # the image of a snapshot this one replaced
        return SnapshotInfo(name=name, template=record.template, created_at=now, source=record.id, memory=True,
                            size=engine.snapshot_size(name))

    def _restore(self, record: ContainerRecord, image_id: str) -> None:
        """Restores a saved container under its id, over a new upper above its frozen files. Should runsc refuse
        the image, the container is started again over those files: it loses its processes and memory, never
        itself."""
        try:
            self.engine._launch(record, None, image_id, keep=True)
        except (RestoreFailed, RuntimeUnavailable) as error:
            self.engine._launch(record)
            raise RestoreFailed(f"{error}; the sandbox was started again over its files, without its processes"
                                ) from None

    def standby(self, record: ContainerRecord) -> None:
        """Saves the container to disk and stops it: it holds no memory until `wake`."""
        engine = self.engine
        with self._saving(record) as image_id:
            record.checkpoint, record.state = image_id, "standby"
            engine._save(record)
            try:
                self._check_room(record, image_id)
            except CapacityExceeded:
                self.wake(record)
                raise
            engine.launcher.stop(record)

    def wake(self, record: ContainerRecord) -> None:
        """Restores a container in standby over its own files, under its id; its image then goes."""
        engine = self.engine
        image_id = record.checkpoint
        assert image_id is not None
        engine.launcher.stop(record)  # what a save left of the container on the machine
        record.generation += 1
        record.state = "running"
        engine._save(record)
        try:
            engine.launcher.start(record, engine._templates.network(record.template),
                                  engine.checkpoints.restorable(image_id))
        except (RuntimeUnavailable, RestoreFailed) as error:
            engine.launcher.stop(record)
            raise _restore_failed(image_id, error) from None
        finally:
            record.checkpoint = None
            engine._save(record)
            engine.checkpoints.remove(image_id)

    def _check_room(self, record: ContainerRecord, image_id: str) -> None:
        """Refuses an image past the container's disk limit (with what it wrote) or the engine's budget; the
        container is restored first, over its own files, as it was."""
        engine = self.engine
        room = Limits(**record.limits).disk - engine.layers.upper_bytes(record.upper)
        try:
            engine.checkpoints.check_room(image_id, room)
        except CapacityExceeded:
            if record.state != "standby":
                engine.launcher.stop(record)
                record.generation += 1
                engine._save(record)
                engine.launcher.start(record, engine._templates.network(record.template),
                                      engine.checkpoints.path(image_id))
                engine.checkpoints.remove(image_id)
            raise


def _restore_failed(image_id: str, error: Exception) -> RestoreFailed:
    if isinstance(error, RestoreFailed):
        return error
    return RestoreFailed(f"checkpoint image {image_id} could not be restored (corrupt, or written by another "
                         f"runtime version): {error}; nothing of the restore is left, reset the sandbox")
