"""What an engine removes once nothing uses it, and what a snapshot holds of its own.

Fork and snapshot freeze uppers into layers that containers and snapshots above them share, and gVisor's keep
checkpoint images that a snapshot and the containers started from it share. Each goes once the store names it no
more; a collection lists first, then reads what is referenced, so that nothing made meanwhile is taken.
"""

from __future__ import annotations

import contextlib
import threading

from rollbox.engine.checkpoints import Checkpoints
from rollbox.engine.layers import UPPER_PREFIX, LayerStore
from rollbox.engine.store import Image, Store


class Collection:
    def __init__(self, store: Store, layers: LayerStore, checkpoints: Checkpoints) -> None:
        self.store = store
        self.layers = layers
        self.checkpoints = checkpoints
        self._lock = threading.Lock()

    def collect_layers(self) -> None:
        """Removes container-made layers (frozen uppers) that no container or snapshot uses any more."""
        with self._lock:
            # An upper is recorded before it is created, so every upper listed is in the references read after.
            candidates = [layer for layer in self.layers.all_ids() if layer.startswith(UPPER_PREFIX)]
            used = self.store.referenced_layers()
            for layer in candidates:
                if layer not in used:
                    self.layers.remove(layer)

    def collect_checkpoints(self) -> None:
        """Removes checkpoint images no snapshot or container needs any more."""
        self.checkpoints.collect(self.store.referenced_checkpoints())

    def image_size(self, image: Image) -> int:
        """Bytes a snapshot holds of its own: its files (the frozen upper on top) and its checkpoint image."""
        top = image.layers[0] if image.layers and image.layers[0].startswith(UPPER_PREFIX) else None
        files = self.layers.upper_bytes(top) if top and self.layers.exists(top) else 0
        with contextlib.suppress(OSError):
            files += self.checkpoints.size(image.checkpoint) if image.checkpoint else 0
        return files


def has_frozen_layers(image: Image) -> bool:
    """Whether dropping a container over `image` can leave a frozen upper unused: only then is `collect_layers`
    worth its cost, which grows with the number of containers."""
    return any(layer.startswith(UPPER_PREFIX) for layer in image.layers)
