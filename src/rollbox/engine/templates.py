"""The templates built on one engine: built once (cached by content), then found by name.

A claim of a registry image gets a template of its own, made from the image as it is (`from_image`) and
named by its digest (IMAGE_PREFIX), so the thousandth claim of an image finds it ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rollbox.engine.builder import Builder, Progress
from rollbox.engine.images.registry import Credentials
from rollbox.engine.images.store import PulledImage
from rollbox.engine.runtimes import Runtime
from rollbox.engine.store import Image, Store
from rollbox.errors import InvalidResource, TemplateNotFound
from rollbox.spec import Metadata, Network, SandboxTemplate, TemplateSpec

IMAGE_PREFIX = "image-"
"""Names of the templates made for claims of an image; a user's template may not take one."""


class Templates:
    def __init__(self, store: Store, builder: Builder, runtime: Callable[[str], Runtime]) -> None:
        self.store = store
        self.builder = builder
        self.runtime = runtime

    def build(self, template: SandboxTemplate, progress: Progress | None = None,
              credentials: Credentials | None = None) -> Image:
        """Builds a template and records it under its name."""
        runtime = self.runtime(template.spec.runtime)
        if template.spec.network.mode == "allowlist" and not runtime.joins_netns:
            raise InvalidResource(
                f"SandboxTemplate {template.metadata.name}: spec.network: mode allowlist needs a runtime that "
                f"joins a prepared network namespace, and {runtime.name} here cannot: use runtime runc, "
                "or mode none")
        image = self.builder.build(template, progress, self._built, credentials)
        spec = template.model_dump_json(by_alias=True)
        self.store.put_template(template.metadata.name, spec, image, time.time())
        return image

    def from_image(self, pulled: PulledImage, runtime: str) -> str:
        """The template that starts `pulled` as it is, with its own user, environment and directory."""
        name = IMAGE_PREFIX + pulled.digest.split(":", 1)[1][:20] + ("" if runtime == "runc" else f"-{runtime}")
        found = self.store.template(name)
        if found is not None and found[1].layers == pulled.layers:
            return name
        self.runtime(runtime)  # a runtime this machine lacks is refused before anything is recorded
        image = pulled.image()
        template = SandboxTemplate(metadata=Metadata(name=name),
                                   spec=TemplateSpec(base=f"docker://{pulled.reference}", runtime=runtime,
                                                     user=image.user))
        self.store.put_template(name, template.model_dump_json(by_alias=True), image, time.time())
        return name

    def from_images(self) -> frozenset[str]:
        return frozenset(name for name in self.names() if name.startswith(IMAGE_PREFIX))

    def layers_held(self) -> set[str]:
        """The layers something besides an image holds: a template of the user's, a snapshot, a container."""
        return self.store.referenced_layers(skip_templates=self.from_images())

    def get(self, name: str) -> SandboxTemplate:
        return SandboxTemplate.model_validate_json(self._found(name)[0])

    def image(self, name: str) -> Image:
        return self._found(name)[1]

    def names(self) -> list[str]:
        return [name for name, *_ in self.store.templates()]

    def network(self, name: str) -> Network:
        """The template's network policy; none (the safest) once the template is gone."""
        found = self.store.template(name)
        return SandboxTemplate.model_validate_json(found[0]).spec.network if found else Network()

    def _built(self, name: str) -> Image | None:
        found = self.store.template(name)
        return found[1] if found else None

    def _found(self, name: str) -> tuple[str, Image]:
        found = self.store.template(name)
        if found is None:
            raise TemplateNotFound(f"template {name!r} is not built on this node: apply it first")
        return found
