"""Progress of a pull, one line per layer at a time: bytes received, of how many, and the rate."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

EVERY = 0.5
"""Seconds between two lines about one layer."""


class LayerProgress:
    def __init__(self, count: int, say: Callable[[str], None]) -> None:
        self.count = count
        self.say = say
        self._lock = threading.Lock()

    def watcher(self, index: int, layer: dict[str, Any]) -> Callable[[int], None]:
        """What the fetch of one layer calls with the bytes received so far."""
        size = int(layer.get("size") or 0)
        short = str(layer.get("digest", ""))[7:19]
        started = time.monotonic()
        last = [0.0]

        def told(received: int) -> None:
            now = time.monotonic()
            if now - last[0] < EVERY and received < size:
                return
            last[0] = now
            rate = received / max(now - started, 1e-3) / 1e6
            with self._lock:
                self.say(f"layer {index + 1}/{self.count} {short}: {received / 1e6:.1f}/{size / 1e6:.1f} MB, "
                         f"{rate:.1f} MB/s")

        return told

    def unpacked(self, index: int) -> None:
        with self._lock:
            self.say(f"layer {index + 1}/{self.count} unpacked")
