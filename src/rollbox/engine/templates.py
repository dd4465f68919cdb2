"""The templates built on one engine: built once (cached by content), then found by name."""

from __future__ import annotations

import time
from collections.abc import Callable

from rollbox.engine.builder import Builder, Progress
from rollbox.engine.runtimes import Runtime
from rollbox.engine.store import Image, Store
from rollbox.errors import InvalidResource, TemplateNotFound
from rollbox.spec import Network, SandboxTemplate


class Templates:
    def __init__(self, store: Store, builder: Builder, runtime: Callable[[str], Runtime]) -> None:
        self.store = store
        self.builder = builder
        self.runtime = runtime

    def build(self, template: SandboxTemplate, progress: Progress | None = None) -> Image:
        """Builds a template and records it under its name."""
        runtime = self.runtime(template.spec.runtime)
        if template.spec.network.mode == "allowlist" and not runtime.joins_netns:
            raise InvalidResource(
                f"SandboxTemplate {template.metadata.name}: spec.network: mode allowlist needs a runtime that "
                f"joins a prepared network namespace, and {runtime.name} here cannot: use runtime runc, "
                "or mode none")
        image = self.builder.build(template, progress, self._built)
        spec = template.model_dump_json(by_alias=True)
        self.store.put_template(template.metadata.name, spec, image, time.time())
        return image

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
