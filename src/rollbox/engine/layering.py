"""Fork and snapshot that carry a container's files (every runtime); `live` carries its processes and memory too.

A parent that has written little (FORK_COPY_BYTES) keeps running through a fork, its processes frozen while its
files are copied into each child's upper. A larger one has its upper frozen in place as a layer the children
share, at a cost independent of its size, and starts again over it (its processes do not carry over). A
snapshot always freezes the upper, and the container goes on over it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rollbox.engine import volumes
from rollbox.engine.cgroups import Cgroups
from rollbox.engine.checkpoints import Checkpoints
from rollbox.engine.layers import UPPER_PREFIX, LayerStore
from rollbox.engine.lifecycle import Lifecycle
from rollbox.engine.store import ContainerRecord, Image
from rollbox.spec import Limits

FORK_COPY_BYTES = 8 * 2**20
"""A parent that has written at most this much keeps running through a fork: its files are copied into each
child's upper while its processes are frozen. Past it, copying would cost more than freezing the upper in
place as a shared layer, which restarts the parent."""
START_WORKERS = 8


class Layering:
    """The engine's file-only fork and snapshot (callers hold the container's lock). `delete` is the engine's, for
    the children of a fork that failed."""

    def __init__(self, lifecycle: Lifecycle, cgroups: Cgroups, delete: Callable[[str], None]) -> None:
        self.lifecycle = lifecycle
        self.cgroups = cgroups
        self.delete = delete
        self._collecting = threading.Lock()

    def collect(self) -> None:
        """Removes container-made layers (frozen uppers) that no container or snapshot uses any more."""
        layers, store = self.lifecycle.layers, self.lifecycle.store
        with self._collecting:
            # List first, then read what is referenced: an upper is recorded before it is created,
            # so every upper in the listing is in the references read after it.
            candidates = [layer for layer in layers.all_ids() if layer.startswith(UPPER_PREFIX)]
            used = store.referenced_layers()
            for layer in candidates:
                if layer not in used:
                    layers.remove(layer)

    def fork(self, parent: ContainerRecord, count: int) -> list[ContainerRecord]:
        """Starts `count` children over the parent's files; their processes start afresh."""
        lifecycle = self.lifecycle
        copied = lifecycle.layers.upper_bytes(parent.upper) <= FORK_COPY_BYTES
        image = parent.image if copied else lifecycle.freeze_upper(parent)
        children = [lifecycle.new_record(parent.template, parent.runtime, image, Limits(**parent.limits),
                                         parent.env, parent.labels) for _ in range(count)]
        for child in children:
            child.baseline, child.parent, child.snapshot = parent.baseline, parent.id, parent.snapshot
            child.volumes = volumes.read_only(parent.volumes)
        seed = lifecycle.layers.upper_dirs(parent.upper)[0] if copied else None
        hold = copied and parent.state == "running"
        with ThreadPoolExecutor(max_workers=min(count + 1, START_WORKERS)) as pool:
            if hold:
                self.cgroups.freeze(parent.oci_id, True)
            try:
                results = [pool.submit(lifecycle.launch, child, seed) for child in children]
                if not copied:
                    results.append(pool.submit(lifecycle.launch, parent))
                errors = [f.exception() for f in results if f.exception()]
            finally:
                if hold:
                    self.cgroups.freeze(parent.oci_id, False)
        if errors:
            for child in children:
                with contextlib.suppress(Exception):
                    self.delete(child.id)
            raise errors[0]  # type: ignore[misc]
        return children

    def snapshot(self, record: ContainerRecord, name: str) -> float:
        """Saves the container's files under `name` and starts it again over them; returns when it was taken."""
        image = self.lifecycle.freeze_upper(record)
        now = time.time()
        self.lifecycle.store.put_snapshot(name, record.template, image, record.id, now)
        self.lifecycle.launch(record)
        return now


def has_frozen_layers(image: Image) -> bool:
    """Whether dropping a container over `image` can leave a frozen upper unused: only then is collecting layers
    worth its cost, which grows with the number of containers."""
    return any(layer.startswith(UPPER_PREFIX) for layer in image.layers)


def image_size(layers: LayerStore, checkpoints: Checkpoints, image: Image) -> int:
    """Bytes a snapshot holds of its own: its files (the frozen upper on top) and its checkpoint image."""
    top = image.layers[0] if image.layers and image.layers[0].startswith(UPPER_PREFIX) else None
    files = layers.upper_bytes(top) if top and layers.exists(top) else 0
    with contextlib.suppress(OSError):
        files += checkpoints.size(image.checkpoint) if image.checkpoint else 0
    return files
