"""The benchmark's own template and warm pool on the router: applying them, waiting for the node to settle, and
telling a warm claim from a cold start."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from clients import Client, bounded, succeed
from cpu import TICKS
from rollbox.client import AsyncSandboxClient
from rollbox.errors import RollboxError

NAME = "rollbox-bench"
"""The template and the warm pool this benchmark applies (and deletes at the end)."""
AGE = "cat /proc/uptime /proc/1/stat"
SETTLE_TIMEOUT = 300.0


def resources(replicas: int) -> str:
    return f"""
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {{name: {NAME}}}
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {{name: {NAME}}}
spec: {{replicas: {replicas}, refillConcurrency: 4, sandboxTemplateRef: {{name: {NAME}}}}}
"""


class Control:
    """Applies the pool and waits for the node to be idle, through the SDK; never timed."""

    def __init__(self, url: str, token: str | None) -> None:
        self.client = AsyncSandboxClient(url, token)

    async def apply(self, replicas: int) -> None:
        await self.client.apply(resources(replicas))
        await self.settle()

    async def require_room(self, replicas: int, embedded: int) -> None:
        """Fails at once, not after SETTLE_TIMEOUT, on a node too small for a warm pool of `replicas`."""
        most = (await self.client.health()).max_sandboxes
        if most is not None and most < replicas:
            raise SystemExit(f"the node runs {most} sandboxes at most and this benchmark's warm pool needs "
                             f"{replicas}: restart the server with --max-sandboxes {embedded}, as the embedded one "
                             "gets")

    async def settle(self) -> None:
        """Waits until the pool is full and no sandbox is starting or being deleted anywhere on the node."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            health = await self.client.health()
            pools = health.pools.values()
            mine = health.pools[NAME]
            if (mine["ready"] >= mine["replicas"] and not any(pool["starting"] for pool in pools)
                    and health.sandboxes == health.claims + sum(pool["ready"] for pool in pools)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node did not settle in {SETTLE_TIMEOUT:.0f} s: {health}")
            await asyncio.sleep(0.1)

    async def close(self, delete: bool = True) -> None:
        """Deletes the pool and the template (unless not `delete`: another side's), and closes the client."""
        if delete:
            with contextlib.suppress(RollboxError):
                await self.client.delete_warmpool(NAME)
                await self.client.delete_template(NAME)
        await self.client.close()


async def cold_claims(client: Client, claims: list[tuple[Any, float]]) -> list[bool]:
    """Which claims got a sandbox whose pid 1 started after the claim was sent (10 ms resolution): a cold
    start, where a warm one was started before. Read inside the sandbox, so it holds for a remote router too."""
    async def cold(handle: Any, sent: float) -> bool:
        out = await succeed(client, handle, AGE)
        checked = time.perf_counter()
        uptime, stat = out.splitlines()[:2]
        age = float(uptime.split()[0]) - int(stat.rpartition(")")[2].split()[19]) / TICKS
        return age < checked - sent

    return await bounded([cold(handle, sent) for handle, sent in claims], 16)
