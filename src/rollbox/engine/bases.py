"""Bases other than `host`: `debian:<suite>` (debootstrap) and OCI images (layout or archive)."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.engine.layers import LayerStore
from rollbox.engine.store import Image
from rollbox.errors import InvalidResource


def debian_base(store: LayerStore, suite: str, say: Callable[[str], None]) -> Image:
    raise InvalidResource(f"base debian:{suite} is not supported yet")


def oci_base(store: LayerStore, kind: str, ref: str, say: Callable[[str], None]) -> Image:
    raise InvalidResource(f"base {kind}:{ref} is not supported yet")
