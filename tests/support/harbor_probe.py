"""A Harbor agent (`--agent tests.support.harbor_probe:ProbeAgent`) that tries every call of Harbor's environment
interface on its sandbox, records what it saw in its logs directory (`probe.json`), and solves the task only if
every check held: a trial of it earns its reward only when the environment behaves as Docker's does.

Runs inside Harbor's own process (Python 3.12, Harbor installed); the tests read what it wrote.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class ProbeAgent(BaseAgent):
    @staticmethod
    def name() -> str:
        return "rollbox-probe"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        checks: dict[str, bool] = {}
        seen: dict[str, str] = {}

        async def out(command: str, **options: object) -> str:
            return await _out(environment, command, **options)

        checks["root unless the Dockerfile says"] = await out("id -u") == "0"
        checks["the Dockerfile's WORKDIR"] = await out("pwd") == "/app"
        checks["cwd"] = await out("pwd", cwd="/tmp") == "/tmp"
        checks["env"] = await out('echo "$PROBE"', env={"PROBE": "a b"}) == "a b"
        checks["user"] = await out("id -u", user=1000) == "1000"
        checks["bash"] = await out("[[ -n x ]] && echo yes") == "yes"
        checks["exit code"] = (await environment.exec("exit 3")).return_code == 3
        started = time.monotonic()
        try:
            await environment.exec("sleep 30", timeout_sec=1)
            checks["timeout"] = False
        except RuntimeError:
            checks["timeout"] = time.monotonic() - started < 10
        seen["route"] = await out("ip -4 route")
        with tempfile.TemporaryDirectory() as scratch:
            checks.update(await _transfers(environment, Path(scratch)))
        checks["is_dir"] = await environment.is_dir("/opt/tree") and not await environment.is_dir("/opt/none")
        checks["is_file"] = await environment.is_file("/opt/tree/a.txt")

        (self.logs_dir / "probe.json").write_text(json.dumps({"checks": checks, "seen": seen}, indent=2))
        if all(checks.values()):
            factor = int(re.search(r"times (\d+)", instruction).group(1))  # type: ignore[union-attr]
            total = sum(map(int, (await out("cat /app/data/numbers.txt")).split()))
            await environment.exec(f"echo {total * factor} > /app/answer.txt")


async def _out(environment: BaseEnvironment, command: str, **options: object) -> str:
    result = await environment.exec(command, **options)  # type: ignore[arg-type]
    return (result.stdout or "").strip()


async def _transfers(environment: BaseEnvironment, scratch: Path) -> dict[str, bool]:
    """Files and directories both ways: modes and links kept, contents byte for byte."""
    script = scratch / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    await environment.upload_file(script, "/opt/probe/run.sh")
    tree = scratch / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("alpha\n")
    (tree / "sub" / "b.txt").write_bytes(bytes(range(256)))
    (tree / "link").symlink_to("a.txt")
    await environment.upload_dir(tree, "/opt/tree")
    back = scratch / "back"
    await environment.download_dir("/opt/tree", back)
    await environment.download_file("/opt/tree/sub/b.txt", scratch / "b.txt")
    return {
        "upload_file keeps the mode": await _out(environment, "/opt/probe/run.sh") == "ran",
        "upload_dir": await _out(environment, "cat /opt/tree/a.txt; readlink /opt/tree/link") == "alpha\na.txt",
        "download_dir": (back / "sub" / "b.txt").read_bytes() == bytes(range(256))
        and (back / "link").readlink() == Path("a.txt"),
        "download_file": (scratch / "b.txt").read_bytes() == bytes(range(256)),
    }


class LinkPlantingAgent(BaseAgent):
    """Leaves links in its logs directory that lead out of it (absolute, climbing, through another link) and one
    that stays inside, and solves nothing: Harbor downloads that directory into the trial's on this machine."""

    @staticmethod
    def name() -> str:
        return "rollbox-links"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await environment.exec("cd /logs/agent && echo mine > note.txt && ln -s note.txt inside "
                               "&& ln -s /etc/hostname absolute && ln -s ../../../../../../etc/hostname climbing "
                               "&& ln -s . here && ln -s here/../../../../../../etc/hostname through")
