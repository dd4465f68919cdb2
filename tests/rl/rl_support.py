"""What the RL tests share: a real embedded server with the example template and warm pool applied."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rollbox.client import SandboxClient
from rollbox.engine import Engine
from rollbox.rl.local import LocalServer
from rollbox.rl.tasks import Task, load_tasks
from tests.conftest import teardown_engine

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEMPLATE = EXAMPLES / "templates" / "rl-python.yaml"


def example_tasks() -> list[Task]:
    return load_tasks(EXAMPLES / "tasks")


@contextmanager
def rl_server(data_dir: Path) -> Iterator[str]:
    """Yields the URL of a `rollbox serve` child process with `rl-python` applied; leaves nothing behind."""
    server = LocalServer(data_dir)
    try:
        server.start()
        with SandboxClient(server.url) as client:
            client.apply(str(TEMPLATE))
        yield server.url
    finally:
        server.close()
        teardown_engine(Engine(data_dir))
