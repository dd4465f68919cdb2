"""A claim's deterministic mode (docs/determinism.md): which claims a warm sandbox can serve, and the seed a claimed
sandbox starts its episode from."""

from __future__ import annotations

from anyio import to_thread

from rollbox.engine import Engine
from rollbox.node.claims import Claim


def needs_cold(engine: Engine, template: str | None, seed: int | None) -> bool:
    """A seed on a template without `spec.deterministic`: its warm sandboxes are not deterministic."""
    return seed is not None and template is not None and not engine.template(template).spec.deterministic


def start(engine: Engine, claim: Claim, seed: int | None) -> None:
    """Starts the claim's episode at its seed's start (0 without one) if its container is deterministic, and records
    the seed and the template's digest on the claim. Blocking: an agent round trip."""
    info = engine.info(claim.container_id)
    claim.template_digest = info.template_digest
    if info.seed is not None:
        claim.seed = seed or 0
        engine.seed(claim.container_id, claim.seed)


async def start_async(engine: Engine, claim: Claim, seed: int | None) -> None:
    """`start`, off the event loop only for a deterministic container (another's costs no round trip)."""
    if engine.info(claim.container_id).seed is None:
        claim.template_digest = engine.info(claim.container_id).template_digest
        return
    await to_thread.run_sync(start, engine, claim, seed)
