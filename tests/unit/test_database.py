"""The SQLite file under both stores: commits never checkpoint, its own thread does, and an exclusive file is one
process's."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import database
from rollbox.engine.database import Database
from rollbox.errors import Conflict

SCHEMA = "CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, record TEXT NOT NULL);"
RECORD = "x" * 2000
"""Bigger than half a page: every commit appends at least one page to the WAL."""
ROWS = 1500
"""More commits than SQLite's own checkpoint threshold (1,000 pages) would let pass."""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "node.db"


@pytest.fixture
def db(path: Path) -> Iterator[Database]:
    opened = Database(path, SCHEMA, exclusive=True)
    yield opened
    opened.close()


def write(db: Database, rows: range) -> None:
    for row in rows:
        with db.transaction() as connection:
            connection.execute("INSERT INTO rows VALUES (?, ?)", (row, RECORD))


def rows_in_the_file_alone(path: Path, tmp_path: Path) -> int:
    """The rows the database file holds without its WAL: what checkpoints copied into it."""
    copy = tmp_path / "copy" / path.name
    copy.parent.mkdir(exist_ok=True)
    shutil.copyfile(path, copy)
    with contextlib.closing(sqlite3.connect(copy)) as connection:
        try:
            return connection.execute("SELECT count(*) FROM rows").fetchone()[0]
        except sqlite3.OperationalError:  # no table yet: its creation is in the WAL too
            return 0


def checkpoint_threads(path: Path) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == f"rollbox-checkpoint-{path.name}"]


def test_commits_leave_the_checkpoint_to_its_thread(db: Database, path: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "CHECKPOINT_EVERY", 600.0)
    monkeypatch.setattr(database, "CHECKPOINT_COMMITS", 10**9)
    write(db, range(ROWS))
    assert rows_in_the_file_alone(path, tmp_path) == 0
    assert Path(f"{path}-wal").stat().st_size > ROWS * 4096
    assert db.query("SELECT count(*) FROM rows") == [(ROWS,)]
    started = time.monotonic()
    db.close()  # wakes the thread waiting 600 s: closing does not wait for it
    assert time.monotonic() - started < 5
    assert not checkpoint_threads(path)
    assert rows_in_the_file_alone(path, tmp_path) == ROWS  # the last connection to close checkpointed
    assert not Path(f"{path}-wal").exists()
    reopened = Database(path, SCHEMA, exclusive=True)
    try:
        assert reopened.query("SELECT count(*) FROM rows") == [(ROWS,)]
    finally:
        reopened.close()


def test_its_thread_checkpoints_while_commits_come_and_ends_when_they_stop(
        db: Database, path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "CHECKPOINT_EVERY", 0.05)
    for rows in (range(10), range(10, 20)):  # the second batch starts the thread anew
        write(db, rows)
        deadline = time.monotonic() + 10
        while rows_in_the_file_alone(path, tmp_path) < rows.stop:
            assert time.monotonic() < deadline, "no checkpoint copied the commits into the file"
            time.sleep(0.02)
        deadline = time.monotonic() + 10
        while checkpoint_threads(path):
            assert time.monotonic() < deadline, "the checkpoint thread outlived the commits"
            time.sleep(0.02)


def test_a_burst_of_commits_brings_the_checkpoint_forward(db: Database, path: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "CHECKPOINT_EVERY", 600.0)
    monkeypatch.setattr(database, "CHECKPOINT_COMMITS", 50)
    write(db, range(60))
    deadline = time.monotonic() + 10
    while rows_in_the_file_alone(path, tmp_path) < 50:
        assert time.monotonic() < deadline, "50 commits did not bring a checkpoint"
        time.sleep(0.02)


def test_an_exclusive_file_is_one_process_s(db: Database, path: Path) -> None:
    with pytest.raises(Conflict, match="in use by another rollbox process"):
        Database(path, SCHEMA, exclusive=True)
    opener = ("from pathlib import Path; from rollbox.engine.database import Database; "
              f"Database(Path({str(path)!r}), {SCHEMA!r}, exclusive=True)")
    other = subprocess.run([sys.executable, "-c", opener], capture_output=True, text=True, timeout=60)
    assert other.returncode == 1
    assert "in use by another rollbox process" in other.stderr
    db.close()
    assert subprocess.run([sys.executable, "-c", opener], capture_output=True, text=True, timeout=60).returncode == 0
    Database(path, SCHEMA, exclusive=True).close()
