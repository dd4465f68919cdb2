"""The steps every operation on a container shares: its record, its lock, and the moves that start it on a new
upper, start it again, freeze its upper into a layer and remove it.

A container that ran before and fails to start again (after a reset, a snapshot or a fork, or in recovery) is
kept, `stopped`: its calls answer that it is not running, and a reset starts it afresh.

The engine's operations (engine.py, the file-only fork and snapshot of `layering`, and `live`'s that carry
processes and memory) are made of these steps, so each of them is here once and none of those modules
reaches into another's.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rollbox.engine import accounts
from rollbox.engine.checkpoints import Checkpoints
from rollbox.engine.expiry import Reaper
from rollbox.engine.launcher import Launcher
from rollbox.engine.layers import LayerStore
from rollbox.engine.store import ContainerRecord, Image, Store
from rollbox.engine.templates import Templates
from rollbox.errors import RestoreFailed, RuntimeUnavailable, SandboxNotFound, SandboxNotRunning
from rollbox.spec import Limits


class Lifecycle:
    """One engine's container records (in its store, mirrored in memory) and the steps that act on them.

    `delete` is the engine's own deletion, which the reaper calls for each container whose `shutdown_after` has
    run out."""

    def __init__(self, store: Store, layers: LayerStore, launcher: Launcher, templates: Templates,
                 checkpoints: Checkpoints, delete: Callable[[str], None]) -> None:
        self.store = store
        self.layers = layers
        self.launcher = launcher
        self.templates = templates
        self.checkpoints = checkpoints
        self.records = {record.id: record for record in store.containers()}
        """Every container's record, mirrored from the store: commands never wait on SQLite."""
        self.reaper = Reaper(self.records, delete)
        self._lock = threading.RLock()
        self._container_locks: dict[str, threading.RLock] = {}

    def record(self, container_id: str) -> ContainerRecord:
        record = self.records.get(container_id)
        if record is None:
            raise SandboxNotFound("does not exist (deleted, expired or never created)", container_id=container_id)
        return record

    def started(self, container_id: str) -> ContainerRecord:
        """The record of a container that can take calls: one that is `stopped` answers so."""
        record = self.record(container_id)
        if record.state == "stopped":
            raise SandboxNotRunning("is stopped (it failed to start again): reset it to start it afresh",
                                    container_id=container_id)
        return record

    def reload(self) -> list[ContainerRecord]:
        """Reads every record from the store again (a recovering engine's first step)."""
        self.records.clear()
        self.records.update((record.id, record) for record in self.store.containers())
        return list(self.records.values())

    def save(self, record: ContainerRecord) -> None:
        self.store.put_container(record)
        self.records[record.id] = record

    def locked(self, container_id: str) -> threading.RLock:
        """The container's lock: one operation that stops or swaps it at a time."""
        with self._lock:
            return self._container_locks.setdefault(container_id, threading.RLock())

    def new_record(self, template: str, runtime: str, image: Image, limits: Limits, env: dict[str, str],
                   labels: dict[str, str]) -> ContainerRecord:
        account = accounts.resolve(self.layers.stack_paths(image.layers), image.user)
        now = time.time()
        return ContainerRecord(
            id=secrets.token_hex(8), template=template, runtime=runtime, image=image, baseline=image,
            upper="", generation=0, limits=limits.model_dump(), env=env, uid=account.uid, gid=account.gid,
            groups=list(account.groups), home=image.workdir or account.home, created_at=now,
            expires_at=now + limits.shutdown_after if limits.shutdown_after else None, labels=labels,
        )

    def launch(self, record: ContainerRecord, seed: Path | None = None, checkpoint: str | None = None, *,
               keep: bool = False) -> None:
        """Starts a container on a new upper (a copy of the upper directory `seed`, or empty), restoring the
        processes saved in the image `checkpoint` if given. A start that fails leaves nothing of itself, and the
        container is forgotten, unless `keep` (its caller starts it another way)."""
        record.upper = self.layers.new_upper_id()
        self.save(record)
        try:
            self.layers.create_upper(record.upper, Limits(**record.limits).disk, seed)
            image = self.checkpoints.restorable(checkpoint) if checkpoint else None
            self.start(record, image)
        except RuntimeUnavailable as error:
            self._failed_start(record, keep)
            if checkpoint and record.volumes and "read-only file system" in str(error):
                raise RestoreFailed(f"a process of the sandbox holds a file of a volume open for writing, and a "
                                    f"fork's children mount volumes read-only: close it first ({error})") from None
            if checkpoint:
                raise RestoreFailed(f"checkpoint image {checkpoint} could not be restored (corrupt?): {error}; "
                                    "nothing of the new container is left") from None
            raise
        except BaseException:
            self._failed_start(record, keep)
            raise
        if record.expires_at:
            self.reaper.ensure()

    def relaunch(self, record: ContainerRecord, checkpoint: str | None = None) -> None:
        """`launch` for a container that ran before: one that fails to start is kept, `stopped`."""
        try:
            self.launch(record, checkpoint=checkpoint, keep=True)
        except BaseException:
            self.stopped(record)
            raise

    def stopped(self, record: ContainerRecord) -> None:
        """Marks a container that failed to start again `stopped`, with nothing of it left running."""
        self.launcher.stop(record)
        record.state = "stopped"
        self.save(record)

    def start(self, record: ContainerRecord, checkpoint: Path | None = None) -> None:
        """`Launcher.start` under the network policy of the container's template."""
        self.launcher.start(record, self.templates.network(record.template), checkpoint)

    def _failed_start(self, record: ContainerRecord, keep: bool) -> None:
        """Removes what a start that failed made; forgets the container too, unless its caller starts it again."""
        if keep:
            self.launcher.remove(record)
        else:
            self.destroy(record)

    def restart(self, record: ContainerRecord) -> None:
        """Starts a container that died again over the same files, as its next generation."""
        self.launcher.stop(record)
        record.generation += 1
        record.state = "running"
        self.save(record)
        try:
            self.start(record)
        except BaseException:
            self.stopped(record)
            raise

    def reset(self, record: ContainerRecord) -> None:
        """Starts the container again on an empty upper over the image it was created from (its template's or
        snapshot's), restoring that image's processes if it saved any; a standby image of its own goes."""
        self.launcher.stop(record)
        self.layers.remove(record.upper)
        record.image = record.baseline
        record.generation += 1
        record.state = "running"
        standby, record.checkpoint = record.checkpoint, None
        if standby:
            self.checkpoints.remove(standby)
        self.relaunch(record, checkpoint=record.baseline.checkpoint)

    def reseed(self, record: ContainerRecord, seed: int, state: bytes | None = None) -> None:
        """`Launcher.reseed`, recorded."""
        self.launcher.reseed(record, seed, state)
        self.save(record)

    def freeze_upper(self, record: ContainerRecord) -> Image:
        """Stops the container and turns its upper into a read-only layer on top of its image; the caller starts
        it again over that layer."""
        self.launcher.stop(record)
        layer = self.layers.promote(record.upper)
        record.image = replace(record.image, layers=[layer, *record.image.layers])
        record.generation += 1
        record.state = "running"
        return record.image

    def destroy(self, record: ContainerRecord) -> None:
        """Takes the container off the machine and forgets it."""
        self.launcher.remove(record)
        self.store.delete_container(record.id)
        self.records.pop(record.id, None)
        with self._lock:
            self._container_locks.pop(record.id, None)
