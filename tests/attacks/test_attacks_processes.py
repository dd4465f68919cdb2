"""Attacks through background processes, which outlive the call that started them.

A background process is forked by the sandbox's agent like any command, so it must stay inside the sandbox's
cgroup (pids, memory) however it forks, and its output stays in the sandbox's memory (the agent's bounded
ring), never in the host's, whether or not anyone reads it.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

from rollbox.engine import Container, Engine
from rollbox.errors import SandboxNotRunning
from rollbox.models import ProcessRequest
from tests.attacks.attack_support import LIMITS, Host, Neighbour, answers_or_resets, rss_bytes
from tests.attacks.test_attacks_limits import DIES_ON_LIMIT, HOST_PIDS
from tests.support.engines import cgroup_value


def _pids(engine: Engine, box: Container) -> int:
    try:
        return int(cgroup_value(engine, box, "pids", "pids.current"))
    except FileNotFoundError:  # a gVisor sandbox that died of the bomb
        return 0


def test_background_fork_bomb_stays_under_the_pids_limit(attack_engine: Engine, box: Container,
                                                          neighbour: Neighbour, host: Host, runtime_name: str) -> None:
    """A fork bomb started in the background, whose starting call has long returned, still meets the limit."""
    processes = box.engine.processes(box.id)
    try:
        asyncio.run(processes.start(ProcessRequest(command="bomb() { bomb | bomb & }; bomb; sleep 100")))
    except SandboxNotRunning:
        assert DIES_ON_LIMIT[runtime_name]
    peak = 0
    for _ in range(20):
        peak = max(peak, _pids(attack_engine, box))
        time.sleep(0.1)
    assert 0 < peak <= HOST_PIDS[runtime_name] or DIES_ON_LIMIT[runtime_name]
    assert subprocess.run(["true"], check=False).returncode == 0
    neighbour.check()
    host.check()
    if answers_or_resets(box, runtime_name, may_die=DIES_ON_LIMIT[runtime_name]) == "alive":
        for info in asyncio.run(processes.list()):
            asyncio.run(processes.delete(info.id))
        assert box.exec("true", timeout=30).ok


def test_unread_output_floods_stay_in_the_sandbox(box: Container, host: Host) -> None:
    """Background processes writing without end, with nobody reading, hold only their rings, in the sandbox."""
    processes = box.engine.processes(box.id)
    before = rss_bytes()

    async def flood() -> list[str]:
        started = [await processes.start(ProcessRequest(command="yes flood", output_limit=1 << 20))
                   for _ in range(8)]
        await asyncio.sleep(2)
        return [info.id for info in started]

    ids = asyncio.run(flood())
    stats = box.stats()
    assert stats.memory_bytes < LIMITS.memory, stats
    assert rss_bytes() - before < 32 * 2**20, "the host held output nobody read"
    assert all(info.running for info in asyncio.run(processes.list())), "a flood stopped: it must never block"
    for process_id in ids:
        asyncio.run(processes.delete(process_id))
    assert box.exec("true", timeout=30).ok
    host.check()
