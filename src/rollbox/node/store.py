"""The node's durable state: claims, warm pools and their ready containers, tenants' snapshots.

It lives in its own SQLite file next to the engine's store. The engine knows containers; this
store knows who holds each one, so a node restarted after a crash gives every claim back its
container and every pool its ready ones, and deletes whatever neither holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from rollbox.engine.database import Database
from rollbox.errors import InvalidRequest
from rollbox.node.claims import Claim

SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (sandbox_id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pools (name TEXT PRIMARY KEY, resource TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pool_containers (container_id TEXT PRIMARY KEY, pool TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    tenant TEXT NOT NULL, name TEXT NOT NULL, source TEXT, PRIMARY KEY (tenant, name));
CREATE TABLE IF NOT EXISTS registry_credentials (
    tenant TEXT NOT NULL, host TEXT NOT NULL, username TEXT NOT NULL, password TEXT NOT NULL,
    PRIMARY KEY (tenant, host));
CREATE TABLE IF NOT EXISTS image_tenants (digest TEXT NOT NULL, tenant TEXT NOT NULL, PRIMARY KEY (digest, tenant));
"""
MIGRATIONS = (
    # 1: a claim names the tenant's sandbox id and the engine's container id apart (they were `id` and `sandbox_id`)
    """ALTER TABLE claims RENAME COLUMN id TO sandbox_id;
       UPDATE claims SET record = json_set(json_remove(record, '$.id', '$.sandbox_id'),
                                           '$.sandbox_id', json_extract(record, '$.id'),
                                           '$.container_id', json_extract(record, '$.sandbox_id'));
       ALTER TABLE pool_sandboxes RENAME TO pool_containers;
       ALTER TABLE pool_containers RENAME COLUMN sandbox_id TO container_id;""",
)
"""What brought a store written by an earlier version to SCHEMA (see Database)."""


class NodeStore(Database):
    def __init__(self, path: Path) -> None:
        # One node per data directory: the file is held exclusively.
        super().__init__(path, SCHEMA, exclusive=True, migrations=MIGRATIONS)

    # -- claims -----------------------------------------------------------------------------

    def claims(self) -> list[Claim]:
        return [Claim.from_json(record) for (record,) in self.query("SELECT record FROM claims")]

    def put_claims(self, claims: Iterable[Claim], deleted: Iterable[Claim] = (), released: Iterable[str] = ()) -> None:
        """Records `claims` and forgets the `deleted` ones, in one transaction.

        A container taken from a pool keeps its pool row while a claim holds it: recovery gives a container to
        its claim before its pool, and a warm claim's commit is then one insert (the row's delete doubled
        it). The row goes in the transaction that lets the container go (its claim's deletion, or `released`
        for a reset's old container), so that a crash never hands a used container back to a pool.
        """
        deleted = list(deleted)
        with self.transaction() as db:
            db.executemany("DELETE FROM claims WHERE sandbox_id=?", [(c.sandbox_id,) for c in deleted])
            db.executemany("DELETE FROM pool_containers WHERE container_id=?",
                           [(c,) for c in [*released, *(c.container_id for c in deleted)]])
            db.executemany("INSERT OR REPLACE INTO claims VALUES (?, ?)",
                           [(c.sandbox_id, c.to_json()) for c in claims])

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
            db.execute("DELETE FROM pool_containers WHERE pool=?", (name,))

    def pool_containers(self) -> list[tuple[str, str]]:
        """(container id, pool name) of every container a pool started: ready ones, and claimed ones not yet let
        go."""
        return [(container, pool) for container, pool in self.query("SELECT container_id, pool FROM pool_containers")]

    def add_pool_container(self, container_id: str, pool: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO pool_containers VALUES (?, ?)", (container_id, pool))

    def remove_pool_containers(self, container_ids: Iterable[str]) -> None:
        with self.transaction() as db:
            db.executemany("DELETE FROM pool_containers WHERE container_id=?", [(c,) for c in container_ids])

    # -- snapshots --------------------------------------------------------------------------

    def snapshots(self, tenant: str | None = None) -> list[tuple[str, str, str | None]]:
        """(tenant, name, source sandbox id) of every snapshot, or of one tenant's."""
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


    # -- images (node/images.py) -------------------------------------------------------------

    def registry_credentials(self, tenant: str) -> list[tuple[str, str, str]]:
        """(host, username, password) of each registry the tenant has credentials for."""
        rows = self.query("SELECT host, username, password FROM registry_credentials WHERE tenant=? ORDER BY host",
                          tenant)
        return [tuple(row) for row in rows]  # type: ignore[misc]

    def put_registry_credentials(self, tenant: str, host: str, username: str, password: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO registry_credentials VALUES (?, ?, ?, ?)",
                       (tenant, host, username, password))

    def delete_registry_credentials(self, tenant: str, host: str) -> bool:
        with self.transaction() as db:
            return db.execute("DELETE FROM registry_credentials WHERE tenant=? AND host=?",
                              (tenant, host)).rowcount > 0

    def image_digests(self, tenant: str) -> set[str]:
        return {digest for (digest,) in self.query("SELECT digest FROM image_tenants WHERE tenant=?", tenant)}

    def add_image_tenant(self, digest: str, tenant: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO image_tenants VALUES (?, ?)", (digest, tenant))

    def remove_image_tenant(self, digest: str, tenant: str | None) -> int:
        """Drops a tenant (every one, for None) from the image's users; returns how many are left."""
        with self.transaction() as db:
            if tenant is None:
                db.execute("DELETE FROM image_tenants WHERE digest=?", (digest,))
            else:
                db.execute("DELETE FROM image_tenants WHERE digest=? AND tenant=?", (digest, tenant))
            return int(db.execute("SELECT COUNT(*) FROM image_tenants WHERE digest=?", (digest,)).fetchone()[0])


SNAPSHOT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9._]{0,61}[a-z0-9])?$")


def check_snapshot_name(name: str) -> None:
    """A snapshot's name: what a template's may be, and `_` too (E2B's snapshot names have it)."""
    if not SNAPSHOT_NAME.match(name):
        raise InvalidRequest(f"snapshot name {name!r}: use lowercase letters, digits, '-', '_' or '.', at most 63 "
                             "characters, starting and ending with a letter or digit")


def snapshot_key(tenant: str, name: str) -> str:
    """The engine's name of a tenant's snapshot: tenants name snapshots independently."""
    return f"{tenant}/{name}"
