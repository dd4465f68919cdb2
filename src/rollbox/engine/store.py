"""The engine's durable record of templates, snapshots and containers (SQLite, one file per node).

A restarted engine reads it to adopt the containers still running and to remove whatever the
machine holds that the store does not know. Writes are small and committed at once (WAL mode).
The containers' table keeps its first name, `sandboxes`, so that stores already written still load.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollbox.engine.database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS templates (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, image TEXT NOT NULL, built_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    name TEXT PRIMARY KEY, template TEXT NOT NULL, image TEXT NOT NULL, source TEXT,
    created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
MIGRATIONS = (
    # 1: the `lifetime` limit of templates and containers is `shutdown_after`
    """UPDATE templates SET spec = json_set(json_remove(spec, '$.spec.limits.lifetime'),
                                           '$.spec.limits.shutdown_after', json_extract(spec, '$.spec.limits.lifetime'))
       WHERE json_type(spec, '$.spec.limits.lifetime') IS NOT NULL;
       UPDATE sandboxes SET record = json_set(json_remove(record, '$.limits.lifetime'),
                                              '$.limits.shutdown_after', json_extract(record, '$.limits.lifetime'))
       WHERE json_type(record, '$.limits.lifetime') IS NOT NULL;""",
)
"""What brought a store written by an earlier version to SCHEMA (see Database)."""


@dataclass
class Image:
    """What a container starts from: a built template or a snapshot."""

    layers: list[str]
    """Read-only layers, top first."""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str = "user"
    host_binds: bool = False
    checkpoint: str | None = None
    """A snapshot with memory: the checkpoint image whose processes a container from it resumes (gVisor)."""
    config: dict[str, Any] = field(default_factory=dict)
    """What a Dockerfile said about running the image, recorded but not acted on (entrypoint, cmd, labels...)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Image:
        return cls(**json.loads(text))


@dataclass
class ContainerRecord:
    """One container as the engine keeps it: enough to start it again, after a reset or a crash."""

    id: str
    template: str
    runtime: str
    image: Image
    """What the container runs over now (grows a layer at each fork or snapshot)."""
    baseline: Image
    """What `reset` returns to: the template or snapshot the container was created from."""
    upper: str
    generation: int
    limits: dict[str, Any]
    env: dict[str, str]
    uid: int
    gid: int
    groups: list[int]
    home: str
    created_at: float
    state: str = "running"
    expires_at: float | None = None
    snapshot: str | None = None
    parent: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """The named volumes bound into it (`engine.volumes.attachment`)."""
    checkpoint: str | None = None
    """In standby (state "standby"): the checkpoint image its processes and memory wait in."""
    determinism: dict[str, Any] | None = None
    """Its deterministic mode's seed and machine (`engine.determinism.settings`); None when it has none."""

    @property
    def oci_id(self) -> str:
        """What the OCI runtime and the cgroups call this start of the container: each restart takes a new
        one, so that it never meets what is left of the previous one."""
        return f"{self.id}.{self.generation}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ContainerRecord:
        data = json.loads(text)
        data["image"] = Image(**data["image"])
        data["baseline"] = Image(**data["baseline"])
        return cls(**data)


class Store(Database):
    def __init__(self, path: Path) -> None:
        # One engine per data directory: a second one's recovery would restart or remove the first's containers.
        super().__init__(path, SCHEMA, exclusive=True, migrations=MIGRATIONS)

    def meta(self, key: str, default: str) -> str:
        with self.transaction() as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            if row:
                return row[0]
            db.execute("INSERT INTO meta VALUES (?, ?)", (key, default))
            return default

    def put_template(self, name: str, spec: str, image: Image, built_at: float) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO templates VALUES (?, ?, ?, ?)", (name, spec, image.to_json(), built_at))

    def template(self, name: str) -> tuple[str, Image] | None:
        rows = self.query("SELECT spec, image FROM templates WHERE name=?", name)
        return (rows[0][0], Image.from_json(rows[0][1])) if rows else None

    def templates(self) -> list[tuple[str, str, Image, float]]:
        return [(n, s, Image.from_json(i), b) for n, s, i, b in self.query("SELECT * FROM templates ORDER BY name")]

    def delete_template(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM templates WHERE name=?", (name,))

    def put_snapshot(self, name: str, template: str, image: Image, source: str | None, created_at: float) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?, ?)",
                       (name, template, image.to_json(), source, created_at))

    def snapshot(self, name: str) -> tuple[str, Image, str | None, float] | None:
        rows = self.query("SELECT template, image, source, created_at FROM snapshots WHERE name=?", name)
        if not rows:
            return None
        template, image, source, created = rows[0]
        return template, Image.from_json(image), source, created

    def snapshots(self) -> list[tuple[str, str, Image, str | None, float]]:
        return [(n, t, Image.from_json(i), s, c) for n, t, i, s, c in
                self.query("SELECT * FROM snapshots ORDER BY name")]

    def delete_snapshot(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM snapshots WHERE name=?", (name,))

    def put_container(self, record: ContainerRecord) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO sandboxes VALUES (?, ?)", (record.id, record.to_json()))

    def container(self, container_id: str) -> ContainerRecord | None:
        rows = self.query("SELECT record FROM sandboxes WHERE id=?", container_id)
        return ContainerRecord.from_json(rows[0][0]) if rows else None

    def containers(self) -> list[ContainerRecord]:
        return [ContainerRecord.from_json(r) for (r,) in self.query("SELECT record FROM sandboxes")]

    def delete_container(self, container_id: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM sandboxes WHERE id=?", (container_id,))

    def referenced_checkpoints(self) -> set[str]:
        """Every checkpoint image some snapshot or container still needs (to start from, reset to, or resume)."""
        used = {image.checkpoint for _, _, image, _, _ in self.snapshots()}
        for record in self.containers():
            used |= {record.checkpoint, record.image.checkpoint, record.baseline.checkpoint}
        return {image_id for image_id in used if image_id}

    def referenced_layers(self, skip_templates: frozenset[str] = frozenset()) -> set[str]:
        """Every layer some template (but those in `skip_templates`), snapshot or container still needs (uppers
        included)."""
        used: set[str] = set()
        for name, _, image, _ in self.templates():
            if name not in skip_templates:
                used.update(image.layers)
        for _, _, image, _, _ in self.snapshots():
            used.update(image.layers)
        for record in self.containers():
            used.update(record.image.layers)
            used.add(record.upper)
        return used

