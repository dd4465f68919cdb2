"""Where an image's manifest, config and layer blobs come from: a registry, or an OCI layout on this machine
(`oci:<dir>[:tag]`, or an `oci-archive:`/`docker-archive:` tar that skopeo turns into one).

A source answers two questions, `resolve` (what the image is) and `fetch` (one layer's blob as a file);
the store decides which layers it still needs, so a layer already unpacked is never read again.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rollbox.engine.images.reference import ImageRef
from rollbox.engine.images.registry import (
    INDEX_TYPES,
    Credentials,
    Progress,
    Registry,
    check_shape,
    media_type,
    platform_manifest,
)
from rollbox.errors import ImageRefused, InvalidResource

TAG_ANNOTATION = "org.opencontainers.image.ref.name"
LOCAL_FORMS = "oci:<dir>[:tag], oci-archive:<file.tar> or docker-archive:<file.tar>"
MAKERS = {"oci": "`skopeo copy ... oci:<dir>:<tag>` or `umoci init`",
          "oci-archive": "`skopeo copy ... oci-archive:<file.tar>`",
          "docker-archive": "`docker save` or `skopeo copy ... docker-archive:<file.tar>`"}


@dataclass(frozen=True)
class Resolved:
    """An image as its source describes it: the manifest for this machine's platform, and its config."""

    name: str
    """How messages name it: the pinned reference, or the local path."""
    digest: str
    manifest: dict[str, Any]
    config: dict[str, Any]

    @property
    def layers(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("layers") or [])

    @property
    def diff_ids(self) -> list[str]:
        return list((self.config.get("rootfs") or {}).get("diff_ids") or [])


class Source(Protocol):
    def resolve(self) -> Resolved: ...

    def fetch(self, layer: dict[str, Any], into: Path, progress: Progress) -> tuple[Path, bool]:
        """The layer's blob as a file, and whether it is a copy in `into` (the caller removes it)."""
        ...


class RegistrySource:
    def __init__(self, registry: Registry, ref: ImageRef, credentials: Credentials, max_bytes: int) -> None:
        self.registry = registry
        self.ref = ref
        self.credentials = credentials
        self.max_bytes = max_bytes

    def resolve(self) -> Resolved:
        pinned, manifest, config = self.registry.resolve(self.ref, self.credentials)
        self.ref = pinned
        resolved = Resolved(str(pinned), str(pinned.digest), manifest, config)
        check_shape(resolved.name, resolved.layers, resolved.diff_ids, self.max_bytes)
        return resolved

    def fetch(self, layer: dict[str, Any], into: Path, progress: Progress) -> tuple[Path, bool]:
        return self.registry.fetch_layer(self.ref, layer, into, self.credentials, progress), True


class LayoutSource:
    """An OCI image layout on this machine, read in place: nothing is copied before it is unpacked."""

    def __init__(self, layout: Path, tag: str | None, shown: str, max_bytes: int) -> None:
        self.layout = layout
        self.tag = tag
        self.shown = shown
        self.max_bytes = max_bytes

    def resolve(self) -> Resolved:
        if not (self.layout / "index.json").is_file():
            raise InvalidResource(f"base {self.shown}: {self.layout} is not an OCI image layout (it has no "
                                  f"index.json): give a directory made by {MAKERS['oci']}")
        index = json.loads((self.layout / "index.json").read_text())
        entries = index.get("manifests") or []
        chosen = [entry for entry in entries if (entry.get("annotations") or {}).get(TAG_ANNOTATION) == self.tag] \
            if self.tag else entries
        if len(chosen) != 1:
            tags = sorted(t for t in ((e.get("annotations") or {}).get(TAG_ANNOTATION, "") for e in entries) if t)
            listed = f"the tags in {self.layout} are: {', '.join(tags)}" if tags else \
                f"{self.layout} has no tagged images"
            raise InvalidResource(f"cannot read the image {self.shown}: no single image "
                                  f"{'tagged ' + repr(self.tag) if self.tag else 'in it'}; {listed}")
        digest = chosen[0]["digest"]
        document = json.loads(self._blob(digest))
        if media_type(document) in INDEX_TYPES:
            digest = platform_manifest(self.shown, document, platform.machine())
            document = json.loads(self._blob(digest))
        config = json.loads(self._blob(document["config"]["digest"]))
        resolved = Resolved(self.shown, digest, document, config)
        check_shape(self.shown, resolved.layers, resolved.diff_ids, self.max_bytes)
        return resolved

    def fetch(self, layer: dict[str, Any], into: Path, progress: Progress) -> tuple[Path, bool]:
        path = self._path(layer["digest"])
        progress(path.stat().st_size)
        return path, False

    def _path(self, digest: str) -> Path:
        algorithm, _, hexdigest = digest.partition(":")
        path = self.layout / "blobs" / algorithm / hexdigest
        if algorithm != "sha256" or not hexdigest.isalnum() or not path.is_file():
            raise ImageRefused(f"image {self.shown}: blob {digest} is missing from the layout")
        return path

    def _blob(self, digest: str) -> bytes:
        data = self._path(digest).read_bytes()
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise ImageRefused(f"image {self.shown}: blob {digest} does not match its digest: refused")
        return data


class ArchiveSource:
    """An `oci-archive:` or `docker-archive:` tar: described by skopeo in place, and copied into a private layout
    only when one of its layers is still needed."""

    def __init__(self, registry: Registry, kind: str, path: Path, scratch: Path, max_bytes: int) -> None:
        self.registry = registry
        self.kind = kind
        self.path = path
        self.scratch = scratch
        self.max_bytes = max_bytes
        self._layout: LayoutSource | None = None

    @property
    def shown(self) -> str:
        return f"{self.kind}:{self.path}"

    def resolve(self) -> Resolved:
        if not self.path.is_file():
            raise InvalidResource(f"base {self.shown}: {self.path} does not exist or is not a file: "
                                  f"give a tar made by {MAKERS[self.kind]}")
        hint = f"check that it is a tar made by {MAKERS[self.kind]}"
        manifest = json.loads(self.registry.local(["inspect", "--raw", self.shown], self.scratch, hint))
        config = json.loads(self.registry.local(["inspect", "--raw", "--config", self.shown], self.scratch, hint))
        digest = "sha256:" + hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
        resolved = Resolved(self.shown, digest, manifest, config)
        check_shape(self.shown, resolved.layers, resolved.diff_ids, self.max_bytes)
        return resolved

    def fetch(self, layer: dict[str, Any], into: Path, progress: Progress) -> tuple[Path, bool]:
        if self._layout is None:
            layout = self.scratch / "layout"
            self.registry.local(["copy", "--quiet", self.shown, f"oci:{layout}:image"], self.scratch,
                                f"make or copy the image again ({MAKERS[self.kind]})")
            self._layout = LayoutSource(layout, "image", self.shown, self.max_bytes)
        return self._layout.fetch(self._converted(layer), into, progress)

    def _converted(self, layer: dict[str, Any]) -> dict[str, Any]:
        """The same layer in the copied layout: a docker-archive's manifest becomes an OCI one on the way, its
        blobs unchanged."""
        assert self._layout is not None
        copied = self._layout.resolve()
        for candidate in copied.layers:
            if candidate.get("digest") == layer.get("digest"):
                return candidate
        raise ImageRefused(f"image {self.shown}: layer {layer.get('digest')} is not in the copy skopeo made")
