"""A data directory written by the previous version opens under this one: its stores migrate once, in place, and
what they held reads back under today's names (a template's `lifetime` is `shutdown_after`; a claim's `id` and
`sandbox_id` are `sandbox_id` and `container_id`)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from rollbox.engine.store import MIGRATIONS as ENGINE_MIGRATIONS
from rollbox.engine.store import Store
from rollbox.node.store import MIGRATIONS as NODE_MIGRATIONS
from rollbox.node.store import NodeStore
from rollbox.spec import SandboxTemplate

PREVIOUS_ENGINE_SCHEMA = """
CREATE TABLE templates (name TEXT PRIMARY KEY, spec TEXT NOT NULL, image TEXT NOT NULL, built_at REAL NOT NULL);
CREATE TABLE snapshots (name TEXT PRIMARY KEY, template TEXT NOT NULL, image TEXT NOT NULL, source TEXT,
                        created_at REAL NOT NULL);
CREATE TABLE sandboxes (id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
PREVIOUS_NODE_SCHEMA = """
CREATE TABLE claims (id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE pools (name TEXT PRIMARY KEY, resource TEXT NOT NULL);
CREATE TABLE pool_sandboxes (sandbox_id TEXT PRIMARY KEY, pool TEXT NOT NULL);
CREATE TABLE snapshots (tenant TEXT NOT NULL, name TEXT NOT NULL, source TEXT, PRIMARY KEY (tenant, name));
"""
IMAGE = json.dumps({"layers": ["l1"], "env": {}, "workdir": None, "user": "user", "host_binds": False})


def _previous_file(path: Path, schema: str, *rows: tuple[str, tuple]) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(schema)
        for sql, values in rows:
            db.execute(sql, values)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 0


def _previous_template(limits: dict) -> str:
    spec = json.loads(SandboxTemplate.model_validate({"metadata": {"name": "old"}}).model_dump_json(by_alias=True))
    spec["spec"]["limits"] = {**{k: v for k, v in spec["spec"]["limits"].items() if k != "shutdown_after"}, **limits}
    return json.dumps(spec)


def _previous_container(limits: dict) -> str:
    return json.dumps({"id": "c1", "template": "old", "runtime": "runc", "image": json.loads(IMAGE),
                       "baseline": json.loads(IMAGE), "upper": "", "generation": 0, "limits": limits, "env": {},
                       "uid": 1000, "gid": 1000, "groups": [], "home": "/home/user", "created_at": 1.0})


def test_an_engine_store_of_the_previous_version_reads_back_its_templates_and_containers(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _previous_file(path, PREVIOUS_ENGINE_SCHEMA,
                   ("INSERT INTO templates VALUES (?, ?, ?, ?)", ("old", _previous_template({"lifetime": 600.0}), IMAGE,
                                                                  1.0)),
                   ("INSERT INTO templates VALUES (?, ?, ?, ?)", ("unset", _previous_template({"lifetime": None}),
                                                                  IMAGE, 1.0)),
                   ("INSERT INTO sandboxes VALUES (?, ?)", ("c1", _previous_container({"lifetime": 60.0, "pids": 64}))))
    store = Store(path)
    try:
        spec, _ = store.template("old")
        assert SandboxTemplate.model_validate_json(spec).spec.limits.shutdown_after == 600.0
        spec, _ = store.template("unset")
        assert SandboxTemplate.model_validate_json(spec).spec.limits.shutdown_after is None
        assert store.container("c1").limits == {"shutdown_after": 60.0, "pids": 64}
    finally:
        store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(ENGINE_MIGRATIONS)
    Store(path).close()  # opened again: nothing left to migrate, and nothing fails


def test_a_node_store_of_the_previous_version_reads_back_its_claims_and_pools(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    claim = {"id": "public1", "tenant": "alice", "sandbox_id": "container1", "template": "old", "created_at": 1.0,
             "labels": {"run": "7"}}
    _previous_file(path, PREVIOUS_NODE_SCHEMA,
                   ("INSERT INTO claims VALUES (?, ?)", ("public1", json.dumps(claim))),
                   ("INSERT INTO pool_sandboxes VALUES (?, ?)", ("container2", "pool")))
    store = NodeStore(path)
    try:
        [migrated] = store.claims()
        assert (migrated.sandbox_id, migrated.container_id, migrated.tenant) == ("public1", "container1", "alice")
        assert migrated.labels == {"run": "7"}
        assert store.pool_containers() == [("container2", "pool")]
        store.delete_claim(migrated)
        assert store.claims() == []
    finally:
        store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(NODE_MIGRATIONS)


def test_a_new_store_starts_at_the_latest_version_and_runs_no_migration(tmp_path: Path) -> None:
    Store(tmp_path / "state.db").close()
    NodeStore(tmp_path / "node.db").close()
    assert sqlite3.connect(tmp_path / "state.db").execute("PRAGMA user_version").fetchone()[0] == len(ENGINE_MIGRATIONS)
    assert sqlite3.connect(tmp_path / "node.db").execute("PRAGMA user_version").fetchone()[0] == len(NODE_MIGRATIONS)
