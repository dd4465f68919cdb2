"""The node's housekeeping thread: it ends claims past `shutdown_after`, whose lease ended, or found unconfirmed after a
restart and never named since; pauses idle sandboxes, shrinks warm pools once their bursts have passed, every
RECONCILE_EVERY seconds forgets what the engine lost, and marks the node alive."""

from __future__ import annotations

import logging
import threading
import time

from rollbox.engine import Engine
from rollbox.errors import SandboxNotFound
from rollbox.node.capacity import Capacity
from rollbox.node.claims import Claim, as_sandbox
from rollbox.node.held import HeldClaims
from rollbox.node.leases import Leases
from rollbox.node.recovery import mark_alive
from rollbox.node.resources import Resources
from rollbox.node.store import NodeStore

log = logging.getLogger("rollbox.node")

RECONCILE_EVERY = 5.0
ALIVE_EVERY = 1.0
"""Seconds between two marks that the node is alive (node/recovery.py)."""


class Sweeper:
    """Sweeps the node every `tick` seconds, in a thread of its own, until the node closes."""

    def __init__(self, engine: Engine, store: NodeStore, capacity: Capacity, resources: Resources, held: HeldClaims,
                 leases: Leases, closed: threading.Event, tick: float) -> None:
        self.engine = engine
        self.leases = leases
        self.store = store
        self.capacity = capacity
        self.resources = resources
        self.held = held
        self.closed = closed
        self._thread = threading.Thread(target=self._run, args=(tick,), name="rollbox-sweeper", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def _run(self, tick: float) -> None:
        reconciled = marked = time.monotonic()
        mark_alive(self.engine.data_dir)
        while not self.closed.wait(tick):
            now, clock = time.time(), time.monotonic()
            if clock - marked >= ALIVE_EVERY:
                marked = clock
                mark_alive(self.engine.data_dir)
            if clock - reconciled >= RECONCILE_EVERY:
                reconciled = clock
                try:
                    self._reconcile()
                except Exception:
                    log.exception("reconciling with the engine failed")
            self.resources.shrink()
            ended = self.leases.ended(now)
            for claim in list(self.held.claims.values()):
                try:
                    expired = claim.expires_at is not None and claim.expires_at <= now
                    if expired and claim.on_timeout != "delete":
                        self._timeout_pause(claim)
                    elif (expired or (claim.lease is not None and (claim.tenant, claim.lease) in ended)
                            or 0 < claim.unconfirmed <= clock):
                        self.held.end(claim)
                    elif (claim.idle_pause_after and not claim.paused and not claim.busy
                          and clock - claim.last_used >= claim.idle_pause_after):
                        self._idle_pause(claim)
                except Exception:
                    log.exception("sweeping sandbox %s failed", claim.sandbox_id)

    def _reconcile(self) -> None:
        """Forgets claims and warm containers the engine no longer has (a template's `shutdown_after` ran out, or
        someone deleted the container behind the node's back), freeing their room."""
        alive = {info.id for info in self.engine.list()}
        for claim in list(self.held.claims.values()):
            if claim.container_id not in alive:
                with claim.lock:
                    if claim.sandbox_id in self.held.claims and self._vanished(claim.container_id):
                        log.warning("sandbox %s lost its container %s: dropping it", claim.sandbox_id,
                                    claim.container_id)
                        self.held.lose(claim)
        for pool in list(self.resources.pools.values()):
            for container_id in [c for c in list(pool.ready) if c not in alive and self._vanished(c)]:
                if pool.forget(container_id):
                    self.store.remove_pool_containers([container_id])
                    self.capacity.release(1)

    def _vanished(self, container_id: str) -> bool:
        """Checked again one by one: a container started after the engine was listed is not vanished."""
        try:
            self.engine.info(container_id)
        except SandboxNotFound:
            return True
        return False

    def _timeout_pause(self, claim: Claim) -> None:
        """Pauses a claim whose end says so (`on_timeout`), as its user would: it has no end from then on."""
        with self.held.holding(claim), as_sandbox(claim):
            if claim.expires_at is None or claim.expires_at > time.time():
                return  # its end moved meanwhile
            if claim.paused == "idle":
                self.engine.resume(claim.container_id)
            self.engine.pause(claim.container_id, memory=claim.on_timeout == "pause")
            claim.paused, claim.expires_at = "user", None
            self.store.put_claims([claim])

    def _idle_pause(self, claim: Claim) -> None:
        if not claim.lock.acquire(blocking=False):
            return
        try:
            # Mark first, then look for calls: a call that starts after the mark sees it and wakes the container.
            with self.held.lock:
                if claim.busy or claim.paused or claim.sandbox_id not in self.held.claims:
                    return
                claim.paused = "idle"
            self.engine.pause(claim.container_id)
            self.store.put_claims([claim])
        finally:
            claim.lock.release()
