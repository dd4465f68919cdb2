"""The wire shapes of registry images and registry credentials (docs/images.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from rollbox.models.sandboxes import Request


class ImagesRequest(Request):
    """`POST /v1/images/pull` and `/v1/images/prefetch`: registry images to have on the node(s)."""

    images: list[Annotated[str, Field(max_length=1024)]] = Field(min_length=1, max_length=1000)
    all_nodes: bool = False
    """On a cluster: every node pulls them (else one node each, where their layers are or the least loaded)."""


class RegistryLogin(Request):
    """`PUT /v1/registries/{host}`: the tenant's credentials for one registry; never shown back."""

    username: str = Field(min_length=1, max_length=1024)
    password: str = Field(min_length=1, max_length=8192)


class RegistryInfo(BaseModel):
    host: str
    username: str


class ImageInfo(BaseModel):
    digest: str
    names: list[str]
    layers: int
    size: int
    """Bytes its layers take unpacked."""
    layer_bytes: dict[str, int] = Field(default_factory=dict)
    """Each layer's bytes, by layer id: images sharing a layer list the same id (a total counts it once)."""
    shared: int = 0
    """Of `size`, the bytes of layers another listed image has too (counted once in a listing's total)."""
    pulled_at: float
    used_at: float
    user: str | None = None
    workdir: str | None = None
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None


class PullEvent(BaseModel):
    """One line of the pull stream; which fields are set depends on `event`."""

    event: Literal["progress", "pulled", "error", "done"]
    image: str | None = None
    message: str | None = None
    info: ImageInfo | None = None
    code: str | None = None
