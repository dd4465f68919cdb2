"""A node's named volumes: per tenant, and who mounts each.

The engine keeps the volumes (`rollbox.engine.volumes`: an ext4 image each, loop-mounted); this module is the
tenants' view and the rule of use: **a volume has at most one read-write holder, and any number of read-only
holders beside it**. A holder is a sandbox id (not a container), so a reset, which swaps the container underneath,
keeps its hold; a claim's hold ends with the claim. Holds are not stored: a restarted node rebuilds them from the
claims it recovers (each claim records its volumes).

The node-level API, for every front end (rollbox's routes, the E2B and agent-sandbox facades), is the `LocalNode`
methods that call this one, all scoped by tenant:

- `create_volume(tenant, VolumeRequest(name=, size=)) -> VolumeInfo` (409 `volume_in_use` if the name exists),
- `volumes(tenant) -> list[VolumeInfo]`, `volume(tenant, name) -> VolumeInfo` (404 `volume_not_found`),
- `delete_volume(tenant, name)` (409 `volume_in_use` while a sandbox mounts it),
- and `claim(tenant, ClaimRequest(volumes=[VolumeMount(name=, mount_path=, read_only=, size=)]))`, where `size`
  creates a missing volume on the way.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import Any

from rollbox.engine import Engine
from rollbox.engine.volumes import Volume
from rollbox.errors import VolumeInUse, VolumeNotFound
from rollbox.models import VolumeInfo, VolumeRequest, VolumeUse
from rollbox.spec import VolumeMount

Mounts = list[dict[str, Any]]
"""How a claim keeps its volumes: `VolumeMount`s as JSON (`name`, `mount_path`, `read_only`, `size`)."""


def volume_key(tenant: str, name: str) -> str:
    """The engine's name of a tenant's volume: tenants name volumes independently."""
    return f"{tenant}/{name}"


def read_only(mounts: Mounts) -> Mounts:
    """A fork's children hold their parent's volumes read-only (docs/volumes.md)."""
    return [{**mount, "read_only": True} for mount in mounts]


class NodeVolumes:
    """The tenants' volumes on one node and their holders. Thread-safe."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._holders: dict[str, dict[str, bool]] = {}
        """Volume key -> {sandbox id: read-only}."""
        self._deleting: set[str] = set()
        self._declared: dict[str, list[VolumeMount]] = {}
        """Each template's declared volumes, read once: a warm claim asks for them and must not parse the template."""

    # -- claims ------------------------------------------------------------------------------

    def mounts_for(self, template: str | None, snapshot: str | None, asked: list[VolumeMount] | None) -> Mounts:
        """A claim's volumes: its template's, with the claim's own on top (one per mount path), shallowest first so
        that a volume mounted inside another's path is mounted after it."""
        if template is None and snapshot is not None:
            found = self.engine.store.snapshot(snapshot)
            template = found[0] if found else None
        declared = self._template_volumes(template) if template is not None else []
        if not declared and not asked:
            return []
        by_path = {mount.mount_path: mount for mount in [*declared, *(asked or [])]}
        return [by_path[path].model_dump() for path in sorted(by_path, key=len)]

    def forget_templates(self) -> None:
        """A template was applied or deleted: read declarations again."""
        self._declared.clear()

    def _template_volumes(self, template: str) -> list[VolumeMount]:
        declared = self._declared.get(template)
        if declared is None:
            declared = self._declared[template] = list(self.engine.template(template).spec.volumes)
        return declared

    def reserve(self, tenant: str, sandbox_id: str, mounts: Mounts) -> None:
        """Makes `sandbox_id` a holder of `mounts`' volumes, creating those given a `size` that do not exist yet.
        VolumeInUse (409) when a read-write mount meets another read-write holder; VolumeNotFound (404) when a
        volume does not exist and no size was given."""
        for mount in mounts:
            if mount.get("size"):
                self._ensure(volume_key(tenant, mount["name"]), mount["size"])
        with self._lock:
            for mount in mounts:
                key = volume_key(tenant, mount["name"])
                if key in self._deleting:
                    raise VolumeInUse(f"volume {mount['name']!r} is being deleted")
                self.engine.volumes.get(key)
                writer = self._writer(key, besides=sandbox_id)
                if not mount["read_only"] and writer is not None:
                    raise VolumeInUse(f"volume {mount['name']!r} is mounted read-write by sandbox {writer}: one "
                                      "sandbox at a time may write to a volume; mount it read-only (read_only: "
                                      "true), or delete that sandbox first")
            self._hold(tenant, sandbox_id, mounts)

    def _ensure(self, key: str, size: int) -> None:
        try:
            self.engine.volumes.get(key)
        except VolumeNotFound:
            with contextlib.suppress(VolumeInUse):  # made by another claim meanwhile
                self.engine.volumes.create(key, size)

    def hold(self, tenant: str, sandbox_id: str, mounts: Mounts) -> None:
        """Records a hold without checking it: a recovered claim's, or a fork's read-only children's."""
        with self._lock:
            self._hold(tenant, sandbox_id, mounts)

    def _hold(self, tenant: str, sandbox_id: str, mounts: Mounts) -> None:
        for mount in mounts:
            holders = self._holders.setdefault(volume_key(tenant, mount["name"]), {})
            holders[sandbox_id] = holders.get(sandbox_id, True) and mount["read_only"]

    def _writer(self, key: str, besides: str) -> str | None:
        return next((holder for holder, ro in self._holders.get(key, {}).items() if not ro and holder != besides),
                    None)

    def release(self, sandbox_id: str) -> None:
        """Ends every hold of `sandbox_id` (its claim ended, or never came to be)."""
        if not self._holders:
            return
        with self._lock:
            for key in [key for key, holders in self._holders.items() if holders.pop(sandbox_id, None) is not None
                        and not holders]:
                del self._holders[key]

    def engine_mounts(self, tenant: str, mounts: Mounts) -> list[tuple[str, str, bool]]:
        """What `Engine.create` takes for `mounts`."""
        return [(volume_key(tenant, mount["name"]), mount["mount_path"], mount["read_only"]) for mount in mounts]

    # -- the volumes API ---------------------------------------------------------------------

    def create(self, tenant: str, request: VolumeRequest) -> VolumeInfo:
        return self._info(tenant, self.engine.volumes.create(volume_key(tenant, request.name), request.size))

    def list(self, tenant: str) -> list[VolumeInfo]:
        owned = [volume for volume in self.engine.volumes.list(volume_key(tenant, ""))
                 if volume.key.rpartition("/")[0] == tenant]
        return [self._info(tenant, volume) for volume in owned]

    def get(self, tenant: str, name: str) -> VolumeInfo:
        return self._info(tenant, self.engine.volumes.get(volume_key(tenant, name)))

    def delete(self, tenant: str, name: str) -> None:
        """Deletes a volume no sandbox mounts (VolumeInUse otherwise), releasing its image and loop device."""
        key = volume_key(tenant, name)
        with self._lock:
            self.engine.volumes.get(key)
            holders = sorted(self._holders.get(key, {}))
            if holders:
                raise VolumeInUse(f"volume {name!r} is mounted by sandbox {', '.join(holders)}: delete "
                                  f"{'it' if len(holders) == 1 else 'them'} first")
            if key in self._deleting:
                raise VolumeInUse(f"volume {name!r} is being deleted")
            self._deleting.add(key)
        try:
            self.engine.delete_volume(key)
        finally:
            with self._lock:
                self._deleting.discard(key)

    def _info(self, tenant: str, volume: Volume) -> VolumeInfo:
        holders = dict(self._holders.get(volume.key, {}))
        users = [VolumeUse(sandbox=holder, read_only=ro) for holder, ro in sorted(holders.items())]
        return VolumeInfo(name=volume.key[len(tenant) + 1:], size=volume.size, used=self.engine.volumes.used(volume),
                          created_at=volume.created_at, mounted_by=users)

    def adopt(self, claims: Iterable[Any]) -> None:
        """A restarted node's holds, from the claims it recovered."""
        for claim in claims:
            if claim.volumes:
                self.hold(claim.tenant, claim.sandbox_id, claim.volumes)
