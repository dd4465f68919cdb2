"""Deletes each container once its `shutdown_after` has run out.

One thread per engine, started by the first container that expires at all: most engines (a node
ends its claims itself) never start it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping

from rollbox.engine.store import ContainerRecord

CHECK_EVERY = 0.5
"""Seconds between looks at the containers' expiry times."""


class Reaper:
    def __init__(self, records: Mapping[str, ContainerRecord], delete: Callable[[str], None]) -> None:
        self._records = records
        self._delete = delete
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def ensure(self) -> None:
        """Starts the thread unless it runs (or the reaper was stopped)."""
        with self._lock:
            if not self._stopped.is_set() and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._reap, name="rollbox-reaper", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stops the thread and waits for a deletion under way."""
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _reap(self) -> None:
        while not self._stopped.wait(CHECK_EVERY):
            now = time.time()
            for record in list(self._records.values()):
                if record.expires_at and record.expires_at <= now:
                    with contextlib.suppress(Exception):
                        self._delete(record.id)
