"""What the node knows of its images: each one's layers, settings and names, and each layer's size and last use.

A record is written only after every layer of the image is committed to the layer store, so a pull
killed at any moment leaves at most layers no image names yet, which the next pull of any image that
has them reuses and eviction otherwise removes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.engine.database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    digest TEXT PRIMARY KEY, names TEXT NOT NULL, config TEXT NOT NULL, layers TEXT NOT NULL,
    pulled_at REAL NOT NULL, used_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS layers (id TEXT PRIMARY KEY, bytes INTEGER NOT NULL, used_at REAL NOT NULL);
"""


@dataclass
class ImageRecord:
    digest: str
    names: list[str]
    """Every reference it was pulled or claimed by (a tag moves: the digest is what stays)."""
    config: dict[str, Any]
    layers: list[str]
    """Layer ids, top first, as an `Image` stacks them."""
    pulled_at: float
    used_at: float
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def settings(self) -> dict[str, Any]:
        return self.config.get("config") or {}


class Catalog(Database):
    def __init__(self, path: Path) -> None:
        super().__init__(path, SCHEMA)

    def put(self, record: ImageRecord, sizes: dict[str, int]) -> None:
        with self.transaction() as db:
            for layer, size in sizes.items():
                db.execute("INSERT OR REPLACE INTO layers VALUES (?, ?, ?)", (layer, size, record.used_at))
            db.execute("INSERT OR REPLACE INTO images VALUES (?, ?, ?, ?, ?, ?)",
                       (record.digest, json.dumps(sorted(set(record.names))), json.dumps(record.config),
                        json.dumps(record.layers), record.pulled_at, record.used_at))

    def get(self, digest: str) -> ImageRecord | None:
        rows = self.query("SELECT * FROM images WHERE digest=?", digest)
        return self._record(rows[0]) if rows else None

    def by_name(self, name: str) -> ImageRecord | None:
        """The newest image known by `name` (a canonical reference, or a local path)."""
        found = [record for record in self.all() if name in record.names]
        return max(found, key=lambda record: record.pulled_at) if found else None

    def all(self) -> list[ImageRecord]:
        sizes = dict(self.query("SELECT id, bytes FROM layers"))
        records = [self._record(row) for row in self.query("SELECT * FROM images ORDER BY used_at DESC")]
        for record in records:
            record.sizes = {layer: sizes.get(layer, 0) for layer in record.layers}
        return records

    def touch(self, digest: str, name: str | None = None) -> None:
        now = time.time()
        with self.transaction() as db:
            row = db.execute("SELECT names, layers FROM images WHERE digest=?", (digest,)).fetchone()
            if row is None:
                return
            names = set(json.loads(row[0])) | ({name} if name else set())
            db.execute("UPDATE images SET used_at=?, names=? WHERE digest=?", (now, json.dumps(sorted(names)), digest))
            db.executemany("UPDATE layers SET used_at=? WHERE id=?", [(now, layer) for layer in json.loads(row[1])])

    def layers(self) -> dict[str, tuple[int, float]]:
        """Every image layer: id -> (bytes, last used)."""
        return {layer: (size, used) for layer, size, used in self.query("SELECT * FROM layers")}

    def forget(self, digest: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM images WHERE digest=?", (digest,))

    def forget_layer(self, layer: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM layers WHERE id=?", (layer,))

    @staticmethod
    def _record(row: tuple[Any, ...]) -> ImageRecord:
        digest, names, config, layers, pulled_at, used_at = row
        return ImageRecord(digest, json.loads(names), json.loads(config), json.loads(layers), pulled_at, used_at)
