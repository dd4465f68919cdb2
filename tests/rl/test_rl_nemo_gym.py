"""rollbox as a NeMo Gym sandbox provider, driven through the real `nemo-gym` package's `AsyncSandbox` and `Sandbox`:
create, exec, upload, download, status, pause, close, and a sandbox's handle passed to another process (pickled,
and as `serialize()`'s JSON descriptor) that drives it there."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pickle
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

pytest.importorskip("nemo_gym.sandbox")

from nemo_gym.sandbox import (
    AsyncSandbox,
    ConnectableProvider,
    Sandbox,
    SandboxCreateError,
    SandboxSpec,
    SandboxStatus,
    SupportsSandboxPauseResume,
    create_provider,
    get_provider_class,
    register_provider,
)

from rollbox import SandboxClient, errors
from rollbox.rl.adapters.nemo_gym import RollboxProvider

ROOT = Path(__file__).resolve().parents[2]
OTHER_PROCESS = """
import asyncio, base64, json, pickle, sys
from nemo_gym.sandbox import AsyncSandbox
from rollbox.rl.adapters.nemo_gym import RollboxProvider

async def main(url, descriptor, handle):
    provider = RollboxProvider(url)
    sandbox = await AsyncSandbox.connect(descriptor, provider=provider, owns_provider=False)
    seen = (await sandbox.exec("cat from-parent.txt; pwd")).stdout
    await sandbox.exec("echo from the child > from-child.txt")
    direct = await provider.exec(handle, "echo $((6 * 7))")
    status = (await sandbox.status()).value
    await sandbox.disconnect()
    await provider.aclose()
    print(json.dumps({"seen": seen, "direct": direct.stdout, "status": status}))

url, descriptor = sys.argv[1], json.loads(sys.argv[2])
asyncio.run(main(url, descriptor, pickle.loads(base64.b64decode(sys.stdin.read()))))
"""


@pytest.fixture(scope="module", autouse=True)
def registered() -> None:
    """What the entry point in pyproject.toml does once rollbox is installed: NeMo Gym finds `rollbox` by name."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    target = entry["nemo_gym.sandbox_providers"]["rollbox"]
    assert EntryPoint("rollbox", target, "nemo_gym.sandbox_providers").load() is RollboxProvider
    register_provider("rollbox", RollboxProvider, override=True)
    assert get_provider_class("rollbox") is RollboxProvider


def test_lifecycle_through_nemo_gym(url: str, tmp_path: Path) -> None:
    config = {"rollbox": {"url": url, "template": "rl-python", "warmpool": "rl-python"}}
    provider = create_provider(config)
    assert isinstance(provider, ConnectableProvider) and isinstance(provider, SupportsSandboxPauseResume)
    spec = SandboxSpec(workdir="/work/task", env={"TASK": "t1"}, files={"README.md": "# task\n"},
                       metadata={"episode": "e1"}, ttl_s=600)

    async def episode() -> str:
        sandbox = AsyncSandbox(config, spec)
        await sandbox.start()
        try:
            assert await sandbox.status() is SandboxStatus.RUNNING
            result = await sandbox.exec("pwd; cat README.md; echo $TASK $EXTRA; echo err >&2; exit 3",
                                        env={"EXTRA": "x"})
            assert (result.stdout, result.stderr, result.return_code) == ("/work/task\n# task\nt1 x\n", "err\n", 3)
            timed = await sandbox.exec("echo before; sleep 30", timeout_s=1)
            assert (timed.error_type, timed.return_code, timed.stdout) == ("timeout", 125, "before\n")
            (tmp_path / "in.bin").write_bytes(bytes(range(256)))
            await sandbox.upload(tmp_path / "in.bin", "data/in.bin")
            assert (await sandbox.exec("wc -c < data/in.bin")).stdout.strip() == "256"
            await sandbox.exec("mkdir -p out && printf 'report' > out/r.txt")
            await sandbox.download("out/r.txt", tmp_path / "back" / "r.txt")
            assert (tmp_path / "back" / "r.txt").read_text() == "report"
            await sandbox.pause()
            assert await sandbox.status() is SandboxStatus.PAUSED
            await sandbox.resume()
            sandbox_id = sandbox._handle.sandbox_id  # type: ignore[union-attr]
            with SandboxClient(url) as client:
                assert client.get_sandbox(sandbox_id).info.labels == {"episode": "e1"}
        finally:
            await sandbox.stop()
        return sandbox_id

    sandbox_id = asyncio.run(episode())
    with SandboxClient(url) as client, pytest.raises(errors.SandboxNotFound):
        client.get_sandbox(sandbox_id)

    with Sandbox(config, SandboxSpec()) as blocking:   # NeMo Gym's blocking facade, on its own event loop
        blocking.start()
        assert blocking.exec("echo $((2 + 3))").stdout == "5\n"
    assert blocking.status() is SandboxStatus.STOPPED

    with pytest.raises(SandboxCreateError, match="no-such-template"):
        asyncio.run(AsyncSandbox(config, SandboxSpec(image="no-such-template")).start())
    with pytest.raises(ValueError, match="provider_options"):
        asyncio.run(AsyncSandbox(config, SandboxSpec(provider_options={"cpu": 2})).start())


def test_handle_used_from_another_process(url: str) -> None:
    provider = RollboxProvider(url, template="rl-python", warmpool="rl-python")

    async def start() -> tuple[AsyncSandbox, dict]:
        sandbox = await AsyncSandbox(provider, SandboxSpec(workdir="/work/shared"), owns_provider=False).start()
        await sandbox.exec("echo from the parent > from-parent.txt")
        return sandbox, await sandbox.serialize()

    sandbox, descriptor = asyncio.run(start())
    assert json.loads(json.dumps(descriptor)) == descriptor and "token" not in json.dumps(descriptor)
    pickled = base64.b64encode(pickle.dumps(sandbox._handle)).decode()
    child = subprocess.run([sys.executable, "-c", OTHER_PROCESS, url, json.dumps(descriptor)], input=pickled,
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report == {"seen": "from the parent\n/work/shared\n", "direct": "42\n", "status": "running"}

    async def finish() -> list[SandboxStatus]:
        assert (await sandbox.exec("cat from-child.txt")).stdout == "from the child\n"
        await sandbox.stop()
        handle = pickle.loads(base64.b64decode(pickled))
        statuses = [await provider.status(handle)]
        with pytest.raises(errors.SandboxNotFound):
            await provider.connect(descriptor)
        await provider.aclose()
        return statuses

    assert asyncio.run(finish()) == [SandboxStatus.STOPPED]
