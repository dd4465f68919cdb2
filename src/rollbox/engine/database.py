"""A SQLite file shared by a process's threads: WAL, one lock, short immediate transactions.

The engine's store and the node's store both sit on it; each write is committed at once. Commits
never copy the WAL back into the file: under the disk load of containers starting and going, that
checkpoint and its fsync are slow (docs/design-notes.md), and the node commits its claims on the
event loop, where it stalled every request. A thread of the file's own does it instead, on a
connection of its own, while writers go on.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollbox.errors import Conflict

CHECKPOINT_EVERY = 1.0
"""Seconds between checkpoints while commits come."""
CHECKPOINT_COMMITS = 500
"""Commits after which a checkpoint comes sooner, so that a burst does not grow the WAL far."""
CHECKPOINT_LINGER = 30
"""Rounds of CHECKPOINT_EVERY without a commit before the thread ends: starting it costs the commit that does
a thread start, which a claim every few seconds should not pay each time."""


class Database:
    def __init__(self, path: Path, schema: str, *, exclusive: bool = False, migrations: Sequence[str] = ()) -> None:
        """Opens (and creates) the file; `exclusive` holds it for this process alone.

        An exclusive file makes a second process (or a second store in this one) on it fail at
        once instead of racing the first. `migrations` are the SQL scripts that brought earlier
        files to `schema`, oldest first: a file written by an earlier version runs those it has not
        seen (its `user_version` counts them), so a data directory outlives an upgrade.
        """
        self.path = path
        self._held = _hold(path) if exclusive else None
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA wal_autocheckpoint=0")  # the checkpoint thread's job
            _migrate(self._db, migrations)
            self._db.executescript(schema)
            self._db.execute(f"PRAGMA user_version={len(migrations)}")
        except sqlite3.OperationalError as error:
            self._db.close()
            if self._held is not None:
                os.close(self._held)
            raise _in_use(path, f" ({error})") from None
        self._lock = threading.Lock()
        self._commits = 0
        """Commits since the last checkpoint (read and written under `_lock`)."""
        self._checkpoints: threading.Thread | None = None
        self._due = threading.Event()
        self._closed = False

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
            self._committed()

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        """Closes the file (again: nothing); its last connection to go copies what the WAL holds into it."""
        self._closed = True
        self._due.set()
        checkpoints = self._checkpoints
        if checkpoints is not None:
            checkpoints.join()
        with self._lock:
            self._db.close()
            held, self._held = self._held, None
        if held is not None:
            os.close(held)

    def _committed(self) -> None:
        """Counts a commit; the first one after a long quiet spell starts the checkpoint thread."""
        self._commits += 1
        if self._checkpoints is None and not self._closed:
            self._checkpoints = threading.Thread(target=self._checkpoint, name=f"rollbox-checkpoint-{self.path.name}",
                                                 daemon=True)
            self._checkpoints.start()
        elif self._commits == CHECKPOINT_COMMITS:
            self._due.set()

    def _checkpoint(self) -> None:
        """Checkpoints every CHECKPOINT_EVERY seconds (or CHECKPOINT_COMMITS commits) while commits come, and ends
        CHECKPOINT_LINGER rounds after the last: an idle file holds no thread, nor one nobody closed for long."""
        checkpointer = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        quiet = 0
        try:
            while True:
                self._due.wait(CHECKPOINT_EVERY)
                self._due.clear()
                with self._lock:
                    quiet = 0 if self._commits else quiet + 1
                    if self._closed or quiet > CHECKPOINT_LINGER:
                        self._checkpoints = None
                        return
                    commits, self._commits = self._commits, 0
                if commits:  # PASSIVE: copies what no reader still needs, never waits for a writer nor makes one wait
                    checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            checkpointer.close()


def _migrate(db: sqlite3.Connection, migrations: Sequence[str]) -> None:
    """Runs the migrations a file written earlier has not seen, each in a transaction of its own; a new file
    needs none."""
    if db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None:
        return
    seen = db.execute("PRAGMA user_version").fetchone()[0]
    for number, script in enumerate(migrations[seen:], start=seen + 1):
        db.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version={number};\nCOMMIT;")


def _hold(path: Path) -> int:
    """Takes `path`'s lock file (`<name>.lock`) for as long as the descriptor returned stays open."""
    held = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(held)
        raise _in_use(path) from None
    return held


def _in_use(path: Path, detail: str = "") -> Conflict:
    return Conflict(f"{path} is in use by another rollbox process{detail}: one per data directory, "
                    "stop the other one first")
