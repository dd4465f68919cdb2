"""Cost per claim against the cgroup counters it comes from, read here directly: within 5%."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from rollbox.engine import Engine
from rollbox.models import ClaimRequest, ExecRequest
from rollbox.node import LocalNode
from rollbox.spec import SandboxTemplate
from tests.support.engines import BASIC, cgroup_file, make_engine, teardown_engine

pytestmark = pytest.mark.anyio
TOLERANCE = 0.05
HOLD = ("python3 -c \"import time; b = bytearray(160 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        "t = time.process_time()\nwhile time.process_time() - t < 2: pass\"")
"""Holds 160 MB touched while it burns two CPU-seconds (three seconds or more of wall time)."""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = make_engine(tmp_path_factory.mktemp("cost"))
    engine.build(SandboxTemplate.model_validate(BASIC))
    yield engine
    teardown_engine(engine)


@pytest.fixture
async def node(engine: Engine) -> AsyncIterator[LocalNode]:
    node = LocalNode(engine, max_sandboxes=4)
    yield node
    node.close()
    engine.destroy_all()
    for path in Path(engine.data_dir).glob("node.db*"):
        path.unlink()


class Counters:
    """The sandbox's cgroup and upper as this test reads them: memory and disk integrated every 10 ms."""

    def __init__(self, engine: Engine, container_id: str) -> None:
        record = engine.store.container(container_id)
        assert record is not None
        self.engine, self.upper = engine, record.upper
        self.cpu_file = cgroup_file(engine, container_id, "cpuacct", "cpuacct.usage")
        self.memory_file = cgroup_file(engine, container_id, "memory", "memory.usage_in_bytes")
        self.memory_gb_seconds = self.disk_gb_seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._integrate)
        self.cpu_start, self.started = self.cpu(), time.monotonic()
        self._thread.start()

    def cpu(self) -> float:
        text = self.cpu_file.read_text()
        if self.engine.cgroups.v2:  # cpu.stat
            usec = next(line for line in text.splitlines() if line.startswith("usage_usec"))
            return int(usec.split()[1]) / 1e6
        return int(text) / 1e9

    def levels(self) -> tuple[int, int]:
        return int(self.memory_file.read_text()), self.engine.layers.upper_bytes(self.upper)

    def _integrate(self) -> None:
        last, (memory, disk) = time.monotonic(), self.levels()
        while not self._stop.wait(0.01):
            now, (next_memory, next_disk) = time.monotonic(), self.levels()
            self.memory_gb_seconds += (memory + next_memory) / 2 * (now - last) / 1e9
            self.disk_gb_seconds += (disk + next_disk) / 2 * (now - last) / 1e9
            last, memory, disk = now, next_memory, next_disk

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return time.monotonic() - self.started


def near(measured: float, truth: float) -> bool:
    return abs(measured - truth) <= TOLERANCE * truth


async def test_a_claims_cost_matches_its_cgroup_counters(node: LocalNode, engine: Engine) -> None:
    info = await node.claim("alice", ClaimRequest(template="basic"))
    counters = Counters(engine, node.held.claims[info.id].container_id)
    result = await node.exec("alice", info.id, ExecRequest(command="head -c 64000000 /dev/zero > /tmp/big && sync"))
    assert result.exit_code == 0, result.stderr
    result = await node.exec("alice", info.id, ExecRequest(command=HOLD, timeout=30))
    assert result.exit_code == 0, result.stderr
    await anyio.sleep(1.5)  # idle: sampled less often, its levels still count
    stats = await node.stats("alice", info.id)
    wall, cpu = counters.stop(), counters.cpu() - counters.cpu_start
    cost = stats.cost
    assert cost is not None
    assert cpu > 2.0 and near(cost.cpu_seconds, cpu), (cost.cpu_seconds, cpu)
    assert counters.memory_gb_seconds > 0.4 and near(cost.memory_gb_seconds, counters.memory_gb_seconds), \
        (cost.memory_gb_seconds, counters.memory_gb_seconds)
    assert counters.disk_gb_seconds > 0.2 and near(cost.disk_gb_seconds, counters.disk_gb_seconds), \
        (cost.disk_gb_seconds, counters.disk_gb_seconds)
    assert near(cost.wall_seconds, wall), (cost.wall_seconds, wall)
    assert cost.memory_peak_bytes >= 160 * 2**20 and cost.disk_peak_bytes >= 64_000_000
    # Every 0.1 s while a command runs (over 2 s of them here), every 1 s when idle (about 4 samples in all): a
    # loaded machine delays some of the sampler's turns, never to the idle pace.
    assert cost.samples >= 15, cost.samples


async def test_the_cost_goes_on_across_a_reset_and_is_kept_when_the_claim_ends(node: LocalNode) -> None:
    info = await node.claim("alice", ClaimRequest(template="basic"))
    burn = ExecRequest(command="python3 -c \"import time; t = time.process_time()\nwhile time.process_time() - t < 1: "
                               "pass\"", timeout=30)
    await node.exec("alice", info.id, burn)
    before = (await node.stats("alice", info.id)).cost
    assert before is not None and before.cpu_seconds >= 1.0
    await node.reset("alice", info.id)
    await node.exec("alice", info.id, burn)
    after = (await node.stats("alice", info.id)).cost
    assert after is not None and after.cpu_seconds >= before.cpu_seconds + 1.0
    assert after.wall_seconds > before.wall_seconds
    await node.delete("alice", info.id)
    ended = node.costs.ended["alice"]
    assert ended.cpu_seconds >= after.cpu_seconds and ended.memory_gb_seconds >= after.memory_gb_seconds
    assert "bob" not in node.costs.ended
