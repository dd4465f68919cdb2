"""The image calls (docs/images.md), described as data like every other call (`_calls`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import TypeAdapter

from rollbox import errors
from rollbox.client._calls import Call, StreamCall, _body, _delete, _dump, _get, _json, _name, _post
from rollbox.models import ImageInfo, ImagesRequest, PullEvent, RegistryInfo, RegistryLogin

PullCallback = Callable[[PullEvent], None]
_IMAGES = _json(TypeAdapter(list[ImageInfo]))
_REGISTRY = _json(TypeAdapter(RegistryInfo))
_REGISTRIES = _json(TypeAdapter(list[RegistryInfo]))
_ANY = _json(TypeAdapter(dict))


class PullReader:
    """Reports progress as it comes; raises the first error once the server is done."""

    def __init__(self, on_progress: PullCallback | None) -> None:
        self.on_progress = on_progress
        self.pulled: list[ImageInfo] = []
        self.failed: list[PullEvent] = []

    def feed(self, line: str) -> list[ImageInfo] | None:
        event = PullEvent.model_validate_json(line)
        if event.event == "done":
            if self.failed:
                first = self.failed[0]
                raise errors.from_code(first.code or "internal", f"{first.image}: {first.message}")
            return self.pulled
        if self.on_progress:
            self.on_progress(event)
        if event.event == "pulled" and event.info is not None:
            self.pulled.append(event.info)
        elif event.event == "error":
            self.failed.append(event)
        return None


def pull(images: Sequence[str], on_progress: PullCallback | None, all_nodes: bool = False
         ) -> StreamCall[list[ImageInfo]]:
    body = _body(ImagesRequest, images=list(images), all_nodes=all_nodes)
    return StreamCall("POST", "/v1/images/pull", PullReader(on_progress), _dump(body))


def prefetch(images: Sequence[str]) -> Call[dict]:
    return _post("/v1/images/prefetch", _ANY, _body(ImagesRequest, images=list(images)))


def list_images() -> Call[list[ImageInfo]]:
    return _get("/v1/images", _IMAGES)


def remove_image(reference: str) -> Call[None]:
    return _delete("/v1/images", params={"image": reference})


def prune_images() -> Call[dict]:
    return _post("/v1/images/prune", _ANY)


def login(host: str, username: str, password: str) -> Call[RegistryInfo]:
    body = _body(RegistryLogin, username=username, password=password)
    return Call("PUT", f"/v1/registries/{_name(host)}", _REGISTRY, body=_dump(body),
                headers={"content-type": "application/json"}, idempotent=True)


def list_registries() -> Call[list[RegistryInfo]]:
    return _get("/v1/registries", _REGISTRIES)


def logout(host: str) -> Call[None]:
    return _delete(f"/v1/registries/{_name(host)}")


class Images:
    """`client.images`: registry images on the node(s). The same calls for both clients: with
    `AsyncSandboxClient`, await what each one returns."""

    def __init__(self, send: Callable[[Any], Any]) -> None:
        self._send = send

    def pull(self, *images: str, on_progress: PullCallback | None = None, all_nodes: bool = False) -> Any:
        """Pulls images with the tenant's registry credentials (`client.registries.login`), progress per layer
        passed to `on_progress` (on a cluster, on every node with `all_nodes`); returns their `ImageInfo`s."""
        return self._send(pull(images, on_progress, all_nodes))

    def prefetch(self, *images: str) -> Any:
        """Starts pulling the next batch's images in the background, so that their claims start at once."""
        return self._send(prefetch(images))

    def list(self) -> Any:
        """The images this tenant pulled or claimed (`ImageInfo`: sizes, and the bytes shared with others)."""
        return self._send(list_images())

    def remove(self, reference: str) -> Any:
        return self._send(remove_image(reference))

    def prune(self) -> Any:
        """Removes every image layer nothing holds (admins only); `{"freed": bytes}`."""
        return self._send(prune_images())


class Registries:
    """`client.registries`: the tenant's credentials for private registries (never shown back)."""

    def __init__(self, send: Callable[[Any], Any]) -> None:
        self._send = send

    def login(self, host: str, username: str, password: str) -> Any:
        return self._send(login(host, username, password))

    def list(self) -> Any:
        return self._send(list_registries())

    def logout(self, host: str) -> Any:
        return self._send(logout(host))
