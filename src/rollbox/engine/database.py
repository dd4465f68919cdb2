"""A SQLite file shared by a process's threads: WAL, one lock, short immediate transactions.

The engine's store and the node's store both sit on it; each write is committed at once.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollbox.errors import Conflict


class Database:
    def __init__(self, path: Path, schema: str, *, exclusive: bool = False) -> None:
        """Opens (and creates) the file; `exclusive` holds it for this process alone.

        Holding it saves two lock syscalls per write and makes a second process on the same file
        fail at once instead of racing the first.
        """
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            if exclusive:
                self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
            self._db.executescript(schema)
        except sqlite3.OperationalError as error:
            self._db.close()
            raise Conflict(f"{path} is in use by another rollbox process ({error}): one per data directory, "
                           "stop the other one first") from None
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()
