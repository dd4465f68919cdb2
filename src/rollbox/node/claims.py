"""The node's record of a claim: which tenant holds which sandbox, and the container that serves it now.

A tenant only ever sees its sandbox id; the container behind it is the engine's, and `reset` or a
restore swaps it for another. So the two ids are kept apart here, and an engine error about a
claim's container is retold as one about its sandbox before it reaches the tenant.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pydantic_core

from rollbox.errors import AboutSandbox, SandboxNotFound
from rollbox.models import SandboxInfo

_TRANSIENT = {"last_used", "busy", "lock", "unconfirmed"}


@dataclass
class Claim:
    """A tenant's hold on one sandbox. `sandbox_id` is the tenant's and never changes; `container_id` is the
    engine's and changes at reset."""

    sandbox_id: str
    tenant: str
    container_id: str
    template: str
    created_at: float
    warmpool: str | None = None
    snapshot: str | None = None
    shutdown_after: float | None = None
    expires_at: float | None = None
    idle_pause_after: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    parent: str | None = None
    """The sandbox id this one was forked from."""
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """The named volumes it mounts (`VolumeMount`s as JSON), held for it whatever container serves it."""
    memory: bool = False
    """Whether it started with the processes and memory of its fork parent or snapshot (gVisor)."""
    limits: dict[str, Any] | None = None
    """The limits it asked for itself (`ClaimRequest.limits`, merged over its template's): a reset keeps them."""
    seed: int | None = None
    """A deterministic sandbox's seed (docs/determinism.md)."""
    template_digest: str | None = None
    request_key: str | None = None
    """The caller's key for the claim that made it (node/keys.py)."""
    lease: str | None = None
    """The id of the lease it was claimed under (node/leases.py), and that lease's ttl then."""
    lease_ttl: float | None = None
    paused: str | None = None
    """Who paused it: "user" (only an explicit resume wakes it) or "idle" (the next call does); traffic to its
    ports wakes it either way."""
    on_timeout: str = "delete"
    """`ClaimRequest.on_timeout`: what its end does."""
    network: dict[str, Any] | None = None
    """Its own network (a `Network` as JSON), narrower than its template's; None: the template's."""
    last_used: float = 0.0
    """Monotonic time of the last call; not stored, a restarted node starts the idle clock anew."""
    busy: int = 0
    """Calls in flight: an idle claim is one with none."""
    unconfirmed: float = 0.0
    """For a claim a restarted node found that was made just before it stopped (its answer may never have left): the
    monotonic time it ends unless a call names it first (node/recovery.py). 0: confirmed."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Serialises what swaps or restarts the container (reset, fork, snapshot, pause, delete)."""

    def info(self) -> SandboxInfo:
        return SandboxInfo(id=self.sandbox_id, template=self.template, warmpool=self.warmpool, tenant=self.tenant,
                           state="paused" if self.paused else "running", created_at=self.created_at,
                           expires_at=self.expires_at, idle_pause_after=self.idle_pause_after,
                           snapshot=self.snapshot, parent=self.parent, labels=self.labels,
                           volumes=self.volumes, memory=self.memory, seed=self.seed,  # type: ignore[arg-type]
                           template_digest=self.template_digest, network=self.network, lease=self.lease)

    def to_json(self) -> str:
        """The stored record, written with pydantic-core (faster than json.dumps; json reads it back)."""
        return pydantic_core.to_json(self, exclude=_TRANSIENT).decode()

    @classmethod
    def from_json(cls, text: str) -> Claim:
        return cls(**json.loads(text))


def environment(claim: Claim, env: dict[str, str] | None) -> dict[str, str] | None:
    """The claim's environment with a call's own over it."""
    return {**claim.env, **env} if claim.env and env else (env or claim.env)


def gone(sandbox_id: str) -> SandboxNotFound:
    return SandboxNotFound("does not exist (deleted, expired or never created)", sandbox_id=sandbox_id)


@contextlib.contextmanager
def as_sandbox(claim: Claim) -> Iterator[None]:
    """Retells the engine's errors about a container during a call on the claim (its own, or one a reset or fork
    starts for it) as errors about its sandbox: the tenant never sees a container id."""
    try:
        yield
    except AboutSandbox as error:
        if error.container_id is None or error.sandbox_id is not None:
            raise
        raise error.retold(claim.sandbox_id) from error
