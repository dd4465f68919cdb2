"""`LocalNode`: this machine's templates, warm pools and claims, over an in-process engine.

Claims are the unit a tenant holds. A claim points at one engine sandbox; `reset` points it at
a fresh one and deletes the old one in the background, so the claim id never changes. Blocking
engine calls run in worker threads; the hot paths stay on the event loop: `exec` (the engine's
agent client is async) and a warm claim (popping a pool and one SQLite write, microseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from anyio import to_thread
from pydantic import ValidationError

from rollbox.engine import Engine
from rollbox.errors import (
    CapacityExceeded,
    Conflict,
    InvalidRequest,
    NotFound,
    SandboxNotFound,
    SandboxNotRunning,
    SnapshotNotFound,
    TemplateNotFound,
)
from rollbox.models import (
    ApplyStatus,
    ClaimRequest,
    ExecRequest,
    ExecResult,
    SandboxInfo,
    SandboxStats,
    SnapshotInfo,
    TemplateInfo,
    WarmPoolInfo,
)
from rollbox.node.base import FileOp, OutputCallback
from rollbox.node.pools import REFILL_QUIET, WarmPool
from rollbox.node.store import Claim, NodeStore
from rollbox.node.watch import ExitWatch
from rollbox.spec import Metadata, Resource, SandboxTemplate, SandboxWarmPool

log = logging.getLogger("rollbox.node")

FILE_OPS = frozenset(FileOp.__args__)  # type: ignore[attr-defined]
MAX_FORK = 64
ROOM_WAIT = 10.0
RECONCILE_EVERY = 5.0
DELETE_QUIET = REFILL_QUIET
"""Seconds without a claim before a background deletion starts, as before a pool's refill. An RL trainer
deletes a step's sandboxes and claims the next step's at once: deleting meanwhile took the CPU from the
claims (bench/server.py's turnover at 64 clients: p50 30-46 ms, 11 ms with deletions held back at DELETE_NICE)."""
DELETE_HOLD_MAX = 1.0
"""Seconds a deletion waits for claims to pause at most, so that a steady stream of claims still frees room."""
DELETE_NICE = 10
"""Scheduling priority of the deletion threads (and of the runtime calls they make): below the event loop's."""


class LocalNode:
    """The `Node` of this machine. Thread-safe; one per engine.

    `max_sandboxes` caps every sandbox on the node (claimed, warm, starting, being deleted);
    `tenant_quota` caps the claims one tenant holds at once; `cold_starts` caps the claims starting a
    sandbox at the same time (the others wait their turn).
    """

    def __init__(self, engine: Engine, *, max_sandboxes: int = 64, tenant_quota: int | None = None,
                 cold_starts: int = 8, tick: float = 0.2) -> None:
        self.engine = engine
        self.max_sandboxes = max_sandboxes
        self.tenant_quota = tenant_quota
        self.store = NodeStore(engine.data_dir / "node.db")
        self._writer = _ClaimWriter(self.store)
        self._lock = threading.Lock()
        self._claims: dict[str, Claim] = {}
        self._tenants: Counter[str] = Counter()
        self._pools: dict[str, WarmPool] = {}
        self._count = 0
        """Sandboxes on the node: claimed, warm, starting and being deleted."""
        self._deleting = 0
        self._room = threading.Condition(self._lock)
        # Starting sandboxes costs CPU (runtime, mounts); more at once than the machine runs only slows
        # every one down. Deleting gets its own workers so that freed room comes back while starts queue.
        self._starts = threading.BoundedSemaphore(cold_starts)
        self._starter = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rollbox-refill")
        self._deleter = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rollbox-delete",
                                           initializer=_lower_priority, initargs=(DELETE_NICE,))
        self._last_claim = 0.0
        """Monotonic time of the last claim, which holds background deletions back (DELETE_QUIET)."""
        self._wanting_room = 0
        """Callers waiting for deletions to free room: deletions then start at once."""
        self._closed = threading.Event()
        self._exits = ExitWatch(self._stopped)
        self._recover()
        self._sweeper = threading.Thread(target=self._sweep, args=(tick,), name="rollbox-sweeper", daemon=True)
        self._sweeper.start()

    # -- resources --------------------------------------------------------------------------

    async def apply(self, resource: Resource, progress: Callable[[str], None]) -> ApplyStatus:
        loop = asyncio.get_running_loop()

        def say(message: str) -> None:
            loop.call_soon_threadsafe(progress, message)

        if isinstance(resource, SandboxTemplate):
            return await to_thread.run_sync(self._apply_template, resource, say)
        return await to_thread.run_sync(self._apply_pool, resource)

    def _apply_template(self, template: SandboxTemplate, say: Callable[[str], None]) -> ApplyStatus:
        name = template.metadata.name
        spec = template.model_dump_json(by_alias=True)
        before = self.engine.store.template(name)
        copies = any(step.copy_ is not None for step in template.spec.steps)
        if before is not None and before[0] == spec and not copies:
            return "unchanged"
        image = self.engine.build(template, say)
        if before is None:
            return "created"
        if before == (spec, image):
            return "unchanged"
        for pool in self._pools.values():
            if pool.template == name:
                self._discard(pool.drain())
        return "configured"

    def _apply_pool(self, resource: SandboxWarmPool) -> ApplyStatus:
        name, template = resource.metadata.name, resource.spec.sandbox_template_ref.name
        if template not in self.engine.templates():
            raise TemplateNotFound(f"warm pool {name}: template {template!r} is not built: apply it first")
        text = resource.model_dump_json(by_alias=True)
        with self._lock:
            existing = self._pools.get(name)
            if existing is not None and existing.resource.model_dump_json(by_alias=True) == text:
                return "unchanged"
            self.store.put_pool(name, text)
            if existing is None:
                self._pools[name] = self._new_pool(resource, [])
                return "created"
        self._discard(existing.update(resource))
        return "configured"

    async def templates(self) -> list[TemplateInfo]:
        return [_template_info(name, spec, built) for name, spec, _, built in self.engine.store.templates()]

    async def template(self, name: str) -> TemplateInfo:
        found = next((t for t in await self.templates() if t.name == name), None)
        if found is None:
            raise TemplateNotFound(f"template {name!r} does not exist: apply it first")
        return found

    async def delete_template(self, name: str) -> None:
        await self.template(name)
        users = [pool.name for pool in self._pools.values() if pool.template == name]
        if users:
            raise Conflict(f"template {name!r} is used by warm pool {', '.join(users)}: delete the pool first")
        await to_thread.run_sync(self.engine.delete_template, name)

    async def warmpools(self) -> list[WarmPoolInfo]:
        return [_pool_info(pool) for pool in sorted(self._pools.values(), key=lambda p: p.name)]

    async def warmpool(self, name: str) -> WarmPoolInfo:
        return _pool_info(self._pool(name))

    async def delete_warmpool(self, name: str) -> None:
        with self._lock:
            pool = self._pool(name)
            del self._pools[name]
        # Stop refilling first: a pool drained while still open starts new sandboxes into itself.
        await to_thread.run_sync(pool.close)
        self._discard(pool.drain())
        self.store.delete_pool(name)

    def _pool(self, name: str) -> WarmPool:
        pool = self._pools.get(name)
        if pool is None:
            raise NotFound(f"warm pool {name!r} does not exist: apply it first")
        return pool

    def _new_pool(self, resource: SandboxWarmPool, ready: list[str]) -> WarmPool:
        return WarmPool(resource, self._launch, lambda sandbox_id: self._discard([sandbox_id]), self._watch,
                        self._starter.submit, ready)

    def _watch(self, sandbox_id: str) -> None:
        """Has a warm sandbox's exit reported (see ExitWatch): a claim must never take a dead one."""
        try:
            fd = self.engine.exit_fd(sandbox_id)
        except SandboxNotFound:
            return
        except SandboxNotRunning:
            self._stopped(sandbox_id)
            return
        except OSError as error:  # out of descriptors, say: the sandbox still serves, unwatched
            log.warning("cannot watch warm sandbox %s for its exit: %s", sandbox_id, error)
            return
        if fd is not None:
            self._exits.add(sandbox_id, fd)

    def _stopped(self, sandbox_id: str) -> None:
        """A watched sandbox stopped. A warm one leaves its pool, which starts another; a claimed one
        stays its claim's, whose next call says it stopped (and `reset` brings it back)."""
        for pool in list(self._pools.values()):
            if pool.forget(sandbox_id):
                log.warning("warm sandbox %s of pool %s stopped while it waited: replacing it", sandbox_id, pool.name)
                self._discard([sandbox_id])
                return

    def _launch(self, pool: WarmPool) -> str:
        self._reserve(1)
        try:
            sandbox_id = self.engine.create(pool.template).id
        except BaseException:
            self._release(1)
            raise
        self.store.add_pool_sandbox(sandbox_id, pool.name)
        return sandbox_id

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, tenant: str, request: ClaimRequest) -> SandboxInfo:
        """Takes a warm sandbox on the event loop (microseconds); only a cold start goes to a thread."""
        self._last_claim = time.monotonic()
        template = self._claim_template(request)
        snapshot = _snapshot_key(tenant, request.snapshot) if request.snapshot else None
        self._take_quota(tenant, 1)
        try:
            warm = None if snapshot else self._take_warm(template, request.warmpool)
            sandbox_id = warm or await to_thread.run_sync(self._start_cold, template, snapshot)
            try:
                now = time.time()
                claim = Claim(
                    id=secrets.token_hex(8), tenant=tenant, sandbox_id=sandbox_id, created_at=now,
                    template=template or self.engine.info(sandbox_id).template, warmpool=request.warmpool,
                    snapshot=request.snapshot, shutdown_after=request.shutdown_after,
                    expires_at=now + request.shutdown_after if request.shutdown_after else None,
                    idle_pause_after=request.idle_pause_after, env=request.env or {}, labels=request.labels or {},
                    last_used=time.monotonic(),
                )
                await self._writer.put(claim)
            except BaseException:
                self._discard([sandbox_id])
                raise
        except BaseException:
            self._give_quota(tenant, 1)
            raise
        with self._lock:
            self._claims[claim.id] = claim
        return claim.info()

    def _claim_template(self, request: ClaimRequest) -> str | None:
        """The template a claim starts from (None for a snapshot, whose template the engine knows)."""
        if request.snapshot is not None:
            if request.warmpool is not None:
                raise InvalidRequest("give a snapshot or a warm pool, not both")
            return None
        if request.warmpool is not None:
            pool_template = self._pool(request.warmpool).template
            if request.template not in (None, pool_template):
                raise InvalidRequest(f"warm pool {request.warmpool!r} holds template {pool_template!r}, "
                                     f"not {request.template!r}: give one of them")
            return pool_template
        if request.template is None:
            raise InvalidRequest("give a template, a warm pool or a snapshot to create a sandbox from")
        return request.template

    def _take_warm(self, template: str | None, warmpool: str | None) -> str | None:
        """A ready sandbox of `template` from its pools (`warmpool` first), or None when they are empty."""
        named = self._pools.get(warmpool) if warmpool is not None else None
        if named is not None and named.template == template:
            sandbox_id = named.take()
            if sandbox_id is not None:
                return sandbox_id
        for pool in list(self._pools.values()):
            if pool is not named and pool.template == template:
                sandbox_id = pool.take()
                if sandbox_id is not None:
                    return sandbox_id
        if named is not None:
            named.missed()  # its demand outran it: a pool with maxReplicas grows
        return None

    def _start_cold(self, template: str | None, snapshot: str | None) -> str:
        if snapshot is None:
            self.engine.template(template)  # type: ignore[arg-type]  # an unknown one fails before taking room
        with self._starts:
            self._reserve_or_evict()
            try:
                return self.engine.create(template, snapshot=snapshot).id
            except BaseException:
                self._release(1)
                raise

    async def claims(self, tenant: str) -> list[SandboxInfo]:
        owned = [claim for claim in list(self._claims.values()) if claim.tenant == tenant]
        owned.sort(key=lambda c: c.created_at)
        # Each claim's state reads its runtime's state file: a long list is read off the event loop.
        return await to_thread.run_sync(lambda: [self._shown(claim) for claim in owned])

    async def get(self, tenant: str, claim_id: str) -> SandboxInfo:
        return self._shown(self._get(tenant, claim_id))

    def _shown(self, claim: Claim) -> SandboxInfo:
        """The claim as `get` and `list` show it: "stopped" once its container has (killed on the host, out of
        memory), until a reset. A claim with a call in flight may be restarting in place, so it shows running."""
        info = claim.info()
        if info.state == "running" and not claim.busy:
            try:
                if self.engine.stopped(claim.sandbox_id):
                    info.state = "stopped"
            except (SandboxNotFound, OSError):  # deleted meanwhile, or out of descriptors: nothing to tell
                pass
        return info

    def _get(self, tenant: str, claim_id: str) -> Claim:
        claim = self._claims.get(claim_id)
        if claim is None or claim.tenant != tenant:
            raise _gone(claim_id)
        return claim

    async def delete(self, tenant: str, claim_id: str) -> None:
        """Forgets the claim on the event loop, answering once that is written; its sandbox goes in the background.

        A reset, fork, snapshot or pause holding the claim is waited for in a thread instead.
        """
        claim = self._get(tenant, claim_id)
        if not claim.lock.acquire(blocking=False):
            await to_thread.run_sync(self._remove, claim)
            return
        try:
            removed = self._unlist(claim)
        finally:
            claim.lock.release()
        if removed:
            await self._writer.delete(claim)
            self._delete_later(claim.sandbox_id)

    def _remove(self, claim: Claim) -> None:
        with claim.lock:
            if not self._unlist(claim):
                return
            self.store.delete_claim(claim)
        self._delete_later(claim.sandbox_id)

    def _unlist(self, claim: Claim) -> bool:
        """Drops the claim from memory and its tenant's count (call holding its lock); False if already gone."""
        with self._lock:
            if self._claims.pop(claim.id, None) is None:
                return False
            self._tenants[claim.tenant] -= 1
            return True

    async def exec(self, tenant: str, claim_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult:
        claim = self._get(tenant, claim_id)
        if claim.paused == "user":
            raise SandboxNotRunning(f"sandbox {claim.id} is paused: resume it before running commands")
        with self._lock:
            claim.busy += 1
            idle = claim.paused == "idle"
        try:
            if idle:
                await to_thread.run_sync(self._wake, claim)
            env = {**claim.env, **request.env} if claim.env and request.env else (request.env or claim.env)
            return await self.engine.exec_async(
                claim.sandbox_id, request.command, timeout=request.timeout, env=env, cwd=request.cwd,
                user=request.user, stdin=request.stdin, output_limit=request.output_limit,
                isolated=request.isolated, on_stdout=on_stdout, on_stderr=on_stderr)
        finally:
            with self._lock:
                claim.busy -= 1
                claim.last_used = time.monotonic()

    async def files(self, tenant: str, claim_id: str, op: FileOp, path: str, **options: Any) -> Any:
        if op not in FILE_OPS:
            raise InvalidRequest(f"{op!r} is not a file operation: use one of {', '.join(sorted(FILE_OPS))}")
        claim = self._get(tenant, claim_id)

        def run() -> Any:
            with self._using(claim):
                return getattr(self.engine.files(claim.sandbox_id), op)(path, **options)

        return await to_thread.run_sync(run)

    @contextlib.contextmanager
    def _using(self, claim: Claim) -> Iterator[None]:
        """Marks a call in flight (so the claim is not idle) and wakes an idle-paused sandbox first."""
        with self._lock:
            claim.busy += 1
        try:
            self._wake(claim)
            yield
        finally:
            with self._lock:
                claim.busy -= 1
                claim.last_used = time.monotonic()

    def _wake(self, claim: Claim) -> None:
        if claim.paused != "idle":
            return
        with claim.lock:
            if claim.paused == "idle":
                self.engine.resume(claim.sandbox_id)
                claim.paused = None
                self.store.put_claims([claim])

    async def reset(self, tenant: str, claim_id: str) -> SandboxInfo:
        return await to_thread.run_sync(self._reset, self._get(tenant, claim_id))

    def _reset(self, claim: Claim) -> SandboxInfo:
        with self._using(claim), self._holding(claim):
            snapshot = _snapshot_key(claim.tenant, claim.snapshot) if claim.snapshot else None
            warm = None if snapshot else self._take_warm(claim.template, claim.warmpool)
            try:
                sandbox_id = warm or self._start_cold(claim.template, snapshot)
            except (CapacityExceeded, NotFound):
                # No room for a second sandbox, or its template or snapshot is gone: restart this one in place.
                self._thaw(claim)
                self.engine.reset(claim.sandbox_id)
                self.store.put_claims([claim])
                return claim.info()
            old, claim.sandbox_id, claim.paused = claim.sandbox_id, sandbox_id, None
            self.store.put_claims([claim], released=[old])
        self._delete_later(old)
        return claim.info()

    async def fork(self, tenant: str, claim_id: str, count: int) -> list[SandboxInfo]:
        if not 1 <= count <= MAX_FORK:
            raise InvalidRequest(f"fork count must be between 1 and {MAX_FORK}")
        return await to_thread.run_sync(self._fork, self._get(tenant, claim_id), count)

    def _fork(self, parent: Claim, count: int) -> list[SandboxInfo]:
        with self._using(parent), self._holding(parent):
            self._take_quota(parent.tenant, count)
            try:
                self._reserve(count)
                try:
                    self._thaw(parent)
                    sandboxes = self.engine.fork(parent.sandbox_id, count)
                except BaseException:
                    self._release(count)
                    raise
            except BaseException:
                self._give_quota(parent.tenant, count)
                raise
            now, idle_clock = time.time(), time.monotonic()
            children = [Claim(
                id=secrets.token_hex(8), tenant=parent.tenant, sandbox_id=sandbox.id, template=parent.template,
                created_at=now, warmpool=parent.warmpool, snapshot=parent.snapshot,
                shutdown_after=parent.shutdown_after,
                expires_at=now + parent.shutdown_after if parent.shutdown_after else None,
                idle_pause_after=parent.idle_pause_after, env=dict(parent.env), labels=dict(parent.labels),
                parent=parent.id, last_used=idle_clock,
            ) for sandbox in sandboxes]
            self.store.put_claims([parent, *children])
            with self._lock:
                self._claims.update((child.id, child) for child in children)
        return [child.info() for child in children]

    async def pause(self, tenant: str, claim_id: str) -> SandboxInfo:
        return await to_thread.run_sync(self._set_paused, self._get(tenant, claim_id), "user")

    async def resume(self, tenant: str, claim_id: str) -> SandboxInfo:
        return await to_thread.run_sync(self._set_paused, self._get(tenant, claim_id), None)

    async def stats(self, tenant: str, claim_id: str) -> SandboxStats:
        return await to_thread.run_sync(self.engine.stats, self._get(tenant, claim_id).sandbox_id)

    def _set_paused(self, claim: Claim, paused: str | None) -> SandboxInfo:
        with self._holding(claim):
            if paused:
                self.engine.pause(claim.sandbox_id)
            else:
                self.engine.resume(claim.sandbox_id)
            claim.paused = paused
            claim.last_used = time.monotonic()
            self.store.put_claims([claim])
        return claim.info()

    @contextlib.contextmanager
    def _holding(self, claim: Claim) -> Iterator[None]:
        """The claim's lock, provided nobody deleted the claim (or let it expire) while we waited for it."""
        with claim.lock:
            if claim.id not in self._claims:
                raise _gone(claim.id)
            yield

    def _thaw(self, claim: Claim) -> None:
        """Resumes a paused sandbox before the engine stops it (fork, snapshot, reset restart it running)."""
        if claim.paused:
            self.engine.resume(claim.sandbox_id)
            claim.paused = None

    # -- snapshots --------------------------------------------------------------------------

    async def snapshot(self, tenant: str, claim_id: str, name: str) -> SnapshotInfo:
        try:
            Metadata(name=name)
        except ValidationError:
            raise InvalidRequest(f"snapshot name {name!r}: use lowercase letters, digits, '-' or '.', "
                                 "at most 63 characters") from None
        return await to_thread.run_sync(self._snapshot, self._get(tenant, claim_id), name)

    def _snapshot(self, claim: Claim, name: str) -> SnapshotInfo:
        with self._using(claim), self._holding(claim):
            self._thaw(claim)
            info = self.engine.snapshot(claim.sandbox_id, _snapshot_key(claim.tenant, name))
            self.store.put_snapshot(claim.tenant, name, claim.id)
            self.store.put_claims([claim])
        return SnapshotInfo(name=name, template=info.template, created_at=info.created_at, source=claim.id)

    async def snapshots(self, tenant: str) -> list[SnapshotInfo]:
        known = {info.name: info for info in self.engine.snapshots()}
        found = []
        for _, name, source in self.store.snapshots(tenant):
            info = known.get(_snapshot_key(tenant, name))
            if info is not None:
                found.append(SnapshotInfo(name=name, template=info.template, created_at=info.created_at,
                                          source=source))
        return found

    async def delete_snapshot(self, tenant: str, name: str) -> None:
        if not any(row[1] == name for row in self.store.snapshots(tenant)):
            raise SnapshotNotFound(f"snapshot {name!r} does not exist")
        await to_thread.run_sync(self.engine.delete_snapshot, _snapshot_key(tenant, name))
        self.store.delete_snapshot(tenant, name)

    # -- capacity ---------------------------------------------------------------------------

    def _reserve(self, count: int, wait: bool = True) -> None:
        """Takes room for `count` sandboxes. A full node fails at once, unless deletions under way
        will free room: then it waits for them, at most ROOM_WAIT seconds."""
        deadline = time.monotonic() + ROOM_WAIT
        with self._room:
            while self._count + count > self.max_sandboxes:
                left = deadline - time.monotonic()
                if not wait or not self._deleting or left <= 0:
                    raise CapacityExceeded(f"this node is at its maximum of {self.max_sandboxes} sandboxes: "
                                           "delete sandboxes or warm pools, or retry later")
                self._wanting_room += 1
                try:
                    self._room.wait(left)
                finally:
                    self._wanting_room -= 1
            self._count += count

    def _reserve_or_evict(self) -> None:
        """Makes room for a cold start, taking a slot from some pool's ready sandbox when the node is full."""
        try:
            self._reserve(1, wait=False)
            return
        except CapacityExceeded:
            for pool in list(self._pools.values()):
                victim = pool.take()
                if victim is not None:
                    self.store.remove_pool_sandboxes([victim])
                    self._deleter.submit(self._delete_now, victim)  # its slot passes to the caller
                    return
        self._reserve(1)

    def _release(self, count: int, deleted: bool = False) -> None:
        with self._room:
            self._count -= count
            self._deleting -= int(deleted)
            self._room.notify_all()
        for pool in list(self._pools.values()):
            pool.wake()

    def _take_quota(self, tenant: str, count: int) -> None:
        with self._lock:
            held = self._tenants[tenant]
            if self.tenant_quota is not None and held + count > self.tenant_quota:
                raise CapacityExceeded(f"tenant {tenant!r} holds {held} sandboxes and its quota is "
                                       f"{self.tenant_quota}: delete some first")
            self._tenants[tenant] += count

    def _give_quota(self, tenant: str, count: int) -> None:
        with self._lock:
            self._tenants[tenant] -= count

    def _discard(self, sandbox_ids: Iterable[str]) -> None:
        """Deletes sandboxes no pool or claim holds any more, in the background."""
        sandbox_ids = list(sandbox_ids)
        if sandbox_ids:
            self.store.remove_pool_sandboxes(sandbox_ids)
        for sandbox_id in sandbox_ids:
            self._delete_later(sandbox_id)

    def _delete_later(self, sandbox_id: str) -> None:
        def delete() -> None:
            try:
                self._hold_for_claims()
                self._delete_now(sandbox_id)
            finally:
                self._release(1, deleted=True)

        with self._lock:
            self._deleting += 1

        try:
            self._deleter.submit(delete)
        except RuntimeError:  # closing: delete it here
            delete()

    def _hold_for_claims(self) -> None:
        """Waits until no claim came for DELETE_QUIET seconds, at most DELETE_HOLD_MAX, unless a caller waits for
        the room a deletion frees or the node closes."""
        deadline = time.monotonic() + DELETE_HOLD_MAX
        while not self._wanting_room:
            wait = min(self._last_claim + DELETE_QUIET, deadline) - time.monotonic()
            if wait <= 0 or self._closed.wait(min(wait, DELETE_QUIET)):
                return

    def _delete_now(self, sandbox_id: str) -> None:
        try:
            self.engine.delete(sandbox_id)
        except SandboxNotFound:
            pass
        except Exception:
            log.exception("deleting sandbox %s failed", sandbox_id)

    # -- background: expiry, idle pause, recovery -------------------------------------------

    def _sweep(self, tick: float) -> None:
        reconciled = time.monotonic()
        while not self._closed.wait(tick):
            now, clock = time.time(), time.monotonic()
            if clock - reconciled >= RECONCILE_EVERY:
                reconciled = clock
                try:
                    self._reconcile()
                except Exception:
                    log.exception("reconciling with the engine failed")
            for pool in list(self._pools.values()):
                self._discard(pool.shrink())
            for claim in list(self._claims.values()):
                try:
                    if claim.expires_at is not None and claim.expires_at <= now:
                        self._remove(claim)
                    elif (claim.idle_pause_after and not claim.paused and not claim.busy
                          and clock - claim.last_used >= claim.idle_pause_after):
                        self._idle_pause(claim)
                except Exception:
                    log.exception("sweeping claim %s failed", claim.id)

    def _reconcile(self) -> None:
        """Forgets claims and warm sandboxes whose sandbox the engine no longer has (a template's
        `lifetime` ran out, or someone deleted it behind the node's back), freeing their room."""
        alive = {info.id for info in self.engine.list()}
        for claim in list(self._claims.values()):
            if claim.sandbox_id not in alive:
                with claim.lock:
                    if claim.id in self._claims and self._vanished(claim.sandbox_id):
                        log.warning("claim %s lost its sandbox %s: dropping it", claim.id, claim.sandbox_id)
                        with self._lock:
                            del self._claims[claim.id]
                            self._tenants[claim.tenant] -= 1
                        self.store.delete_claim(claim)
                        self._release(1)
        for pool in list(self._pools.values()):
            for sandbox_id in [s for s in list(pool.ready) if s not in alive and self._vanished(s)]:
                if pool.forget(sandbox_id):
                    self.store.remove_pool_sandboxes([sandbox_id])
                    self._release(1)

    def _vanished(self, sandbox_id: str) -> bool:
        """Checked again one by one: a sandbox started after the engine was listed is not vanished."""
        try:
            self.engine.info(sandbox_id)
        except SandboxNotFound:
            return True
        return False

    def _idle_pause(self, claim: Claim) -> None:
        if not claim.lock.acquire(blocking=False):
            return
        try:
            # Mark first, then look for calls: a call that starts after the mark sees it and wakes the sandbox.
            with self._lock:
                if claim.busy or claim.paused or claim.id not in self._claims:
                    return
                claim.paused = "idle"
            self.engine.pause(claim.sandbox_id)
            self.store.put_claims([claim])
        finally:
            claim.lock.release()

    def _recover(self) -> None:
        """Gives claims and pools back the sandboxes the engine adopted; deletes the ones nobody holds."""
        alive = {info.id for info in self.engine.list()}
        self._count = len(alive)
        held: set[str] = set()
        for claim in self.store.claims():
            if claim.sandbox_id not in alive:
                log.warning("claim %s lost its sandbox %s: dropping it", claim.id, claim.sandbox_id)
                self.store.delete_claim(claim)
                continue
            claim.last_used = time.monotonic()
            self._claims[claim.id] = claim
            self._tenants[claim.tenant] += 1
            held.add(claim.sandbox_id)
        resources = [SandboxWarmPool.model_validate_json(text) for text in self.store.pools()]
        names = {resource.metadata.name for resource in resources}
        ready: defaultdict[str, list[str]] = defaultdict(list)
        stale = []
        for sandbox_id, pool in self.store.pool_sandboxes():  # a claimed sandbox's row stays: its claim wins
            if sandbox_id in alive and sandbox_id not in held and pool in names:
                ready[pool].append(sandbox_id)
                held.add(sandbox_id)
            else:
                stale.append(sandbox_id)
        self.store.remove_pool_sandboxes(stale)
        for resource in resources:
            self._pools[resource.metadata.name] = self._new_pool(resource, ready[resource.metadata.name])
        for sandbox_ids in ready.values():
            for sandbox_id in sandbox_ids:
                self._watch(sandbox_id)
        for sandbox_id in alive - held:
            self._delete_later(sandbox_id)
        snapshots = {info.name for info in self.engine.snapshots()}
        for tenant, name, _ in self.store.snapshots():
            if _snapshot_key(tenant, name) not in snapshots:
                self.store.delete_snapshot(tenant, name)

    # -- operations -------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        pools = {pool.name: {"template": pool.template, "replicas": pool.resource.spec.replicas,
                             "ready": len(pool.ready), "starting": pool.starting} for pool in self._pools.values()}
        return {"sandboxes": self._count, "max_sandboxes": self.max_sandboxes, "claims": len(self._claims),
                "pools": pools}

    def close(self) -> None:
        """Stops background work and waits for it. Sandboxes and claims stay for the next node."""
        self._closed.set()
        self._sweeper.join()
        for pool in list(self._pools.values()):
            pool.close()
        self._starter.shutdown(wait=True)
        self._deleter.shutdown(wait=True)
        self._exits.close()
        self.store.close()


class _ClaimWriter:
    """Records the claims made and deleted during one event-loop turn in one transaction.

    The commit is the costliest step of a warm claim; under a burst (64 clients claiming at once)
    it is paid once per loop turn instead of once per claim. A claim (or a deletion) answers only
    once written, so what a client was told survives a crash of the server.
    """

    def __init__(self, store: NodeStore) -> None:
        self.store = store
        self._claims: list[Claim] = []
        self._deleted: list[Claim] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def put(self, claim: Claim) -> None:
        self._claims.append(claim)
        await self._written()

    async def delete(self, claim: Claim) -> None:
        self._deleted.append(claim)
        await self._written()

    def _written(self) -> asyncio.Future[None]:
        if not self._waiting:  # the batch's first: its loop flushes it (asking for the loop costs a syscall)
            self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._flush)
        future = self._loop.create_future()
        self._waiting.append(future)
        return future

    def _flush(self) -> None:
        claims, deleted, waiting = self._claims, self._deleted, self._waiting
        self._claims, self._deleted, self._waiting = [], [], []
        try:
            self.store.put_claims(claims, deleted)
        except Exception as error:
            for future in waiting:
                if not future.done():
                    future.set_exception(error)
            return
        for future in waiting:
            if not future.done():
                future.set_result(None)


def _lower_priority(nice: int) -> None:
    """Lowers the calling thread's CPU priority (Linux schedules threads one by one); its children inherit it."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _gone(claim_id: str) -> SandboxNotFound:
    return SandboxNotFound(f"sandbox {claim_id!r} does not exist (deleted, expired or never created)")


def _snapshot_key(tenant: str, name: str) -> str:
    """The engine's name of a tenant's snapshot: tenants name snapshots independently."""
    return f"{tenant}/{name}"


def _template_info(name: str, spec: str, built_at: float) -> TemplateInfo:
    return TemplateInfo(name=name, spec=json.loads(spec)["spec"], built_at=built_at)


def _pool_info(pool: WarmPool) -> WarmPoolInfo:
    return WarmPoolInfo(name=pool.name, template=pool.template, replicas=pool.resource.spec.replicas,
                        max_replicas=pool.resource.spec.max_replicas, target=pool.target, ready=len(pool.ready),
                        starting=pool.starting)
