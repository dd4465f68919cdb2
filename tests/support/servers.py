"""Real servers for the tiers that test through HTTP: each over an engine of its own, removed to the last mount."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from rollbox.client import SandboxClient
from rollbox.engine import Engine
from rollbox.engine.images.registry import RegistrySettings
from rollbox.node import LocalNode
from rollbox.rl.tasks import Task, load_tasks
from rollbox.server import create_app
from rollbox.server.local import LocalServer
from rollbox.server.threaded import ThreadServer
from tests.support.engines import make_engine, teardown_engine

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RL_TEMPLATE = EXAMPLES / "templates" / "rl-python.yaml"


@contextlib.contextmanager
def router(root: Path, tokens: dict[str, str] | None = None, admins: tuple[str, ...] = (),
           registries: RegistrySettings | None = None) -> Iterator[str]:
    """The HTTP API on a unix socket over a node and engine of its own (reaching registries as `registries` say)."""
    engine = make_engine(root, registries)
    node = LocalNode(engine, max_sandboxes=32)
    try:
        with ThreadServer(create_app(node, tokens, admins=admins)) as server:
            yield server.url
    finally:
        node.close()
        teardown_engine(engine)


def wait_until_serving(url: str, process: subprocess.Popen[bytes], what: str = "the server") -> None:
    """Waits for a server started as `process` to answer `url`/healthz (a minute at most)."""
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, f"{what} exited at start"
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/healthz").status_code == 200:
                return
        assert time.monotonic() < deadline, f"{what} did not come up"
        time.sleep(0.05)


def example_tasks() -> list[Task]:
    return load_tasks(EXAMPLES / "tasks")


@contextlib.contextmanager
def rl_server(data_dir: Path) -> Iterator[str]:
    """Yields the URL of a `rollbox serve` child process with `rl-python` applied."""
    server = LocalServer(data_dir)
    try:
        server.start()
        with SandboxClient(server.url) as client:
            client.apply(str(RL_TEMPLATE))
        yield server.url
    finally:
        server.close()
        teardown_engine(Engine(data_dir))


TEMPLATE = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: basic}
spec:
  steps:
    - run: mkdir -p /opt/data && echo baseline > /opt/data/file
"""
"""The `basic` template as a client applies it to a `router`."""
TOKENS = {"alice": "alice-token", "bob": "bob-token"}
ADMINS = ("alice",)
