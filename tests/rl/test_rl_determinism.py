"""Deterministic episodes recorded and replayed (docs/determinism.md): a trajectory keeps its group's seed and the
template's digest, a replay sets the sandbox up as the group's was (seed, start state, fork) and reports the first
observation that differs, byte for byte."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rollbox.client import AsyncSandboxClient
from rollbox.rl.collect import Observation, collect_async
from rollbox.rl.env import AsyncSandboxEnv
from rollbox.rl.replay import first_difference, replay
from rollbox.rl.trajectory import read_trajectories
from tests.support.servers import EXAMPLES, example_tasks

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
TEMPLATE = EXAMPLES / "templates" / "rl-deterministic.yaml"
TASKS = [task.model_copy(update={"template": "rl-deterministic", "warmpool": "rl-deterministic"})
         for task in example_tasks() if task.id == "ledger-split-remainder"]
PROBES = [
    "date; date -u +%s.%N; cat /proc/uptime",
    "ls -la --full-time . | head -5; echo note > note.txt; stat -c '%y %z' note.txt",
    "python3 -c \"import uuid, random, time; print(uuid.uuid4(), random.random(), hash('x'), time.time())\"",
    "head -c 8 /dev/urandom | od -An -tx1; mktemp; ps -eo pid,ppid,args",
]


async def probing_policy(observation: Observation) -> Any:
    script = [{"tool": "bash", "command": probe} for probe in PROBES] + [{"tool": "submit"}]
    return script[observation.step]


async def test_deterministic_trajectories_replay_byte_for_byte(url: str, tmp_path: Path) -> None:
    async with AsyncSandboxClient(url) as client:
        await client.apply(str(TEMPLATE))
    out = tmp_path / "trajectories.jsonl"
    await collect_async(probing_policy, TASKS, url=url, group_size=3, seed=5, out=out, progress=False)
    recorded = sorted(read_trajectories(out), key=lambda t: t.member)
    assert [t.member for t in recorded] == [0, 1, 2] and {t.forked for t in recorded} == {2}
    assert recorded[0].sandbox_seed is not None and {t.sandbox_seed for t in recorded} == {recorded[0].sandbox_seed}
    assert recorded[0].template_digest and recorded[0].template_digest.startswith("sha256:")
    assert "2024" in recorded[0].steps[0].observation  # the seed's clock, not the host's
    uuids = {t.steps[2].observation for t in recorded}
    assert len(uuids) == 3  # a group's members draw from seeds of their own
    time.sleep(1.1)  # the host's clock moves on
    async with AsyncSandboxEnv(TASKS, url=url) as env:
        for trajectory in recorded:
            assert await replay(trajectory, env) == [], trajectory.episode_id
        tampered = recorded[1].model_copy(deep=True)
        text = tampered.steps[2].observation
        tampered.steps[2].observation = text[:30] + ("0" if text[30] != "0" else "1") + text[31:]
        difference = await first_difference(tampered, env)
    assert difference is not None and (difference.step, difference.what) == (3, "observation")
    assert difference.offset == len(text[:30].encode())
    assert "differs at byte" in str(difference)


async def test_a_seed_makes_a_claim_of_any_template_deterministic(url: str) -> None:
    async with AsyncSandboxClient(url) as client:
        dates = []
        for _ in range(2):
            async with client.create_sandbox(template="rl-python", seed=42) as sandbox:  # a cold start
                assert sandbox.info.seed == 42 and sandbox.info.template_digest
                dates.append((await sandbox.commands.run("date; python3 -c 'import uuid; print(uuid.uuid4())'")).stdout)
        async with client.create_sandbox(template="rl-python") as plain:
            assert plain.info.seed is None
    assert dates[0] == dates[1] and "2024" in dates[0]
