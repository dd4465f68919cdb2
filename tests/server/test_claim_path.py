"""The warm claim's path on the node: claims and deletions written before they answer, in batches, over a real
engine. (Dispatch, auth and error answers over an in-memory node are in the unit tier.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine
from rollbox.errors import SandboxNotFound
from rollbox.models import ClaimRequest
from rollbox.node import LocalNode
from rollbox.spec import SandboxTemplate, SandboxWarmPool
from tests.support.engines import BASIC, make_engine, teardown_engine


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = make_engine(tmp_path_factory.mktemp("claim-path"))
    engine.build(SandboxTemplate.model_validate(BASIC))
    yield engine
    teardown_engine(engine)


@pytest.fixture
def node(engine: Engine) -> Iterator[LocalNode]:
    node = LocalNode(engine, max_sandboxes=24)
    pool = SandboxWarmPool.model_validate({"metadata": {"name": "warm"}, "spec": {
        "replicas": 8, "refillConcurrency": 4, "sandboxTemplateRef": {"name": "basic"}}})
    asyncio.run(node.apply(pool, print))
    deadline = time.monotonic() + 60
    while len(node.resources.pools["warm"].ready) < 8:
        assert time.monotonic() < deadline, "the pool did not fill"
        time.sleep(0.05)
    yield node
    node.close()
    engine.destroy_all()
    for path in Path(engine.data_dir).glob("node.db*"):
        path.unlink()


def stored(node: LocalNode) -> set[str]:
    return {claim.sandbox_id for claim in node.store.claims()}


def test_claims_and_deletions_are_written_before_they_answer(node: LocalNode) -> None:
    async def main() -> None:
        claims = await asyncio.gather(*(node.claim("alice", ClaimRequest(warmpool="warm")) for _ in range(6)))
        ids = {claim.id for claim in claims}
        assert stored(node) == ids  # one transaction for the whole burst, committed before any answer
        gone = sorted(ids)[:4]
        let_go = {node.held.claims[sandbox_id].container_id for sandbox_id in gone}
        await asyncio.gather(*(node.delete("alice", sandbox_id) for sandbox_id in gone))
        assert stored(node) == ids - set(gone)
        assert not {container for container, _ in node.store.pool_containers()} & let_go
        assert [claim.id for claim in await node.claims("alice")] == [c.id for c in claims if c.id not in gone]
        with pytest.raises(SandboxNotFound):
            await node.delete("alice", gone[0])

    asyncio.run(main())


def test_a_crash_after_a_delete_or_reset_never_hands_the_used_sandbox_to_a_pool(
        node: LocalNode, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claimed sandbox keeps its pool row until its claim lets it go, in the same transaction: a node
    that dies before deleting the sandbox finds it held by nobody at restart, and deletes it."""
    async def used_then_crashed() -> set[str]:
        claims = [await node.claim("alice", ClaimRequest(warmpool="warm")) for _ in range(2)]
        used = {node.held.claims[claim.id].container_id for claim in claims}
        monkeypatch.setattr(node.deletions, "later", lambda container_id: None)  # dies before deleting anything
        await node.delete("alice", claims[0].id)
        await node.reset("alice", claims[1].id)
        return used

    used = asyncio.run(used_then_crashed())
    assert used <= {info.id for info in engine.list()}
    node.close()
    again = LocalNode(engine, max_sandboxes=24)
    try:
        assert not used & set(again.resources.pools["warm"].ready)
        deadline = time.monotonic() + 30
        while used & {info.id for info in engine.list()}:
            assert time.monotonic() < deadline, "the used sandboxes were not deleted"
            time.sleep(0.05)
    finally:
        again.close()


def test_a_delete_waits_for_whatever_holds_the_claim(node: LocalNode) -> None:
    async def main() -> None:
        claim = await node.claim("alice", ClaimRequest(warmpool="warm"))
        lock = node.held.claims[claim.id].lock
        lock.acquire()
        threading.Timer(0.2, lock.release).start()
        started = time.monotonic()
        await node.delete("alice", claim.id)
        assert time.monotonic() - started >= 0.15
        assert claim.id not in stored(node)
        with pytest.raises(SandboxNotFound):
            await node.get("alice", claim.id)

    asyncio.run(main())
