"""Image references: what a user may write to name a registry image, and its one canonical spelling.

Accepted: `docker://HOST/REPO:TAG`, `docker://HOST/REPO@sha256:HEX` (a tag and a digest together pin the
digest), and the same without `docker://`. A name without a registry host (`python:3.11`,
`library/python`) is Docker Hub's, as `docker pull` reads it. The canonical form always names the host
and a tag or digest, so that two spellings of one image share a cache entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollbox.errors import InvalidRequest

PREFIX = "docker://"
DOCKER_HUB = "docker.io"
DEFAULT_TAG = "latest"
SPELLINGS = "docker://HOST/REPO:TAG, docker://HOST/REPO@sha256:<64 hex>, or the same without docker://"
_HOST = re.compile(r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
                   r"(?::[0-9]{1,5})?$|^\[[0-9a-fA-F:]+\](?::[0-9]{1,5})?$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_LENGTH = 1024


@dataclass(frozen=True)
class ImageRef:
    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """`HOST/REPO`: what registry credentials and access are decided for."""
        return f"{self.host}/{self.repository}"

    def __str__(self) -> str:
        """The canonical spelling, without `docker://`."""
        text = self.name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    @property
    def transport(self) -> str:
        """What skopeo reads: a digest when there is one (a tag beside it is only a label)."""
        return PREFIX + (f"{self.name}@{self.digest}" if self.digest else f"{self.name}:{self.tag}")

    def pinned(self, digest: str) -> ImageRef:
        return ImageRef(self.host, self.repository, self.tag, digest)


def as_base(text: str) -> str:
    """A registry image as a template base names it: `python:3.11` is `docker://docker.io/library/python:3.11`."""
    return PREFIX + str(parse(text))


def is_image(text: str) -> bool:
    """Whether a template base or a claim names a registry image (rather than `host`, `debian:`, `oci:`...)."""
    local = text.startswith(("oci:", "oci-archive:", "docker-archive:"))
    return text.startswith(PREFIX) or ("/" in text.split("@", 1)[0] and not local)


def parse(text: str) -> ImageRef:
    """The reference `text` names; InvalidRequest says what is wrong and which spellings work."""
    original = text
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_LENGTH:
        raise InvalidRequest(f"image {original!r}: give a registry image as {SPELLINGS}")
    text = text.strip()
    text = text.removeprefix(PREFIX)
    name, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise InvalidRequest(f"image {original!r}: a digest is sha256: and 64 lowercase hex digits")
    tag = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, _, tag = name.rpartition(":")
        if not _TAG.match(tag):
            raise InvalidRequest(f"image {original!r}: tag {tag!r} may hold letters, digits, '_', '.' and '-' "
                                 "(at most 128, not starting with '.' or '-')")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        host, repository = first, rest
    else:
        host, repository = DOCKER_HUB, name if "/" in name else f"library/{name}"
    if not _HOST.match(host) or not all(_COMPONENT.match(part) for part in repository.split("/")):
        raise InvalidRequest(f"image {original!r}: the repository is lowercase path components after a registry "
                             f"host; use {SPELLINGS}")
    return ImageRef(host.lower(), repository, tag or (None if digest else DEFAULT_TAG), digest or None)
