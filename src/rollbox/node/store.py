"""The node's durable state: claims, warm pools and their ready sandboxes, tenants' snapshots.

It lives in its own SQLite file next to the engine's store. The engine knows sandboxes; this
store knows who holds each one, so a node restarted after a crash gives every claim back its
sandbox and every pool its ready ones, and deletes whatever neither holds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pydantic_core

from rollbox.engine.database import Database
from rollbox.models import SandboxInfo

SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pools (name TEXT PRIMARY KEY, resource TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pool_sandboxes (sandbox_id TEXT PRIMARY KEY, pool TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    tenant TEXT NOT NULL, name TEXT NOT NULL, source TEXT, PRIMARY KEY (tenant, name));
"""
_TRANSIENT = {"last_used", "busy", "lock"}


@dataclass
class Claim:
    """A tenant's hold on one sandbox. `sandbox_id` changes at reset; `id` never does."""

    id: str
    tenant: str
    sandbox_id: str
    template: str
    created_at: float
    warmpool: str | None = None
    snapshot: str | None = None
    shutdown_after: float | None = None
    expires_at: float | None = None
    idle_pause_after: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    parent: str | None = None
    paused: str | None = None
    """Who paused it: "user" (only an explicit resume wakes it) or "idle" (the next call does)."""
    last_used: float = 0.0
    """Monotonic time of the last call; not stored, a restarted node starts the idle clock anew."""
    busy: int = 0
    """Calls in flight: an idle claim is one with none."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Serialises what swaps or restarts the sandbox (reset, fork, snapshot, pause, delete)."""

    def info(self) -> SandboxInfo:
        return SandboxInfo(id=self.id, template=self.template, warmpool=self.warmpool, tenant=self.tenant,
                         state="paused" if self.paused else "running", created_at=self.created_at,
                         expires_at=self.expires_at, idle_pause_after=self.idle_pause_after,
                         snapshot=self.snapshot, parent=self.parent, labels=self.labels)

    def to_json(self) -> str:
        """The stored record (pydantic-core writes it in half the time json.dumps takes; json reads it back)."""
        return pydantic_core.to_json(self, exclude=_TRANSIENT).decode()

    @classmethod
    def from_json(cls, text: str) -> Claim:
        return cls(**json.loads(text))


class NodeStore(Database):
    def __init__(self, path: Path) -> None:
        # One node per data directory: the file is held exclusively.
        super().__init__(path, SCHEMA, exclusive=True)

    # -- claims -----------------------------------------------------------------------------

    def claims(self) -> list[Claim]:
        return [Claim.from_json(record) for (record,) in self.query("SELECT record FROM claims")]

    def put_claims(self, claims: Iterable[Claim], deleted: Iterable[Claim] = (), released: Iterable[str] = ()) -> None:
        """Records `claims` and forgets the `deleted` ones, in one transaction.

        A sandbox taken from a pool keeps its pool row while a claim holds it: recovery gives a sandbox to
        its claim before its pool, and a warm claim's commit is then one insert (the row's delete doubled
        it). The row goes in the transaction that lets the sandbox go (its claim's deletion, or `released`
        for a reset's old sandbox), so that a crash never hands a used sandbox back to a pool.
        """
        deleted = list(deleted)
        with self.transaction() as db:
            db.executemany("DELETE FROM claims WHERE id=?", [(c.id,) for c in deleted])
            db.executemany("DELETE FROM pool_sandboxes WHERE sandbox_id=?",
                           [(s,) for s in [*released, *(c.sandbox_id for c in deleted)]])
            db.executemany("INSERT OR REPLACE INTO claims VALUES (?, ?)", [(c.id, c.to_json()) for c in claims])

    def delete_claim(self, claim: Claim) -> None:
        self.put_claims((), deleted=[claim])

    # -- warm pools -------------------------------------------------------------------------

    def pools(self) -> list[str]:
        return [resource for (resource,) in self.query("SELECT resource FROM pools ORDER BY name")]

    def put_pool(self, name: str, resource: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO pools VALUES (?, ?)", (name, resource))

    def delete_pool(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM pools WHERE name=?", (name,))
            db.execute("DELETE FROM pool_sandboxes WHERE pool=?", (name,))

    def pool_sandboxes(self) -> list[tuple[str, str]]:
        """(sandbox id, pool name) of every sandbox a pool started: ready ones, and claimed ones not yet let go."""
        return [(sandbox, pool) for sandbox, pool in self.query("SELECT sandbox_id, pool FROM pool_sandboxes")]

    def add_pool_sandbox(self, sandbox_id: str, pool: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO pool_sandboxes VALUES (?, ?)", (sandbox_id, pool))

    def remove_pool_sandboxes(self, sandbox_ids: Iterable[str]) -> None:
        with self.transaction() as db:
            db.executemany("DELETE FROM pool_sandboxes WHERE sandbox_id=?", [(s,) for s in sandbox_ids])

    # -- snapshots --------------------------------------------------------------------------

    def snapshots(self, tenant: str | None = None) -> list[tuple[str, str, str | None]]:
        """(tenant, name, source claim) of every snapshot, or of one tenant's."""
        if tenant is None:
            return [tuple(row) for row in self.query("SELECT tenant, name, source FROM snapshots")]  # type: ignore[misc]
        rows = self.query("SELECT tenant, name, source FROM snapshots WHERE tenant=? ORDER BY name", tenant)
        return [tuple(row) for row in rows]  # type: ignore[misc]

    def put_snapshot(self, tenant: str, name: str, source: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?)", (tenant, name, source))

    def delete_snapshot(self, tenant: str, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM snapshots WHERE tenant=? AND name=?", (tenant, name))

