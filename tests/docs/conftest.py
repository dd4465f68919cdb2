"""The docs tier: every code block of README.md and docs/*.md that is meant to run runs, against a real server.

The rules, for whoever writes docs:
- A ```python, ```bash or ```sh block runs. Any other block (```yaml, ```text, a diagram without a language) never
  does.
- A block that is not meant to run (a machine's set-up, a cluster of machines, a fragment that needs what the text
  around it names, placeholders like SANDBOX or <token>) says so in its info string: ```python no-run. A no-run
  Python block must still parse.
- Blocks run one by one, each on its own, in a fresh process whose working directory holds `examples/` and `.venv/`
  of this checkout (so `examples/tasks` and `.venv/bin/rollbox` are there, and what a block writes is thrown away).
- The server is `rollbox serve` on a free loopback port with a temporary data directory, one for the whole tier,
  with `examples/templates/rl-python.yaml` applied as the README applies it. In a block, `http://127.0.0.1:8080`
  (where `rollbox serve` listens by default) is that server, and ROLLBOX_URL names it for the CLI. A block that
  needs another template applies it itself, as a reader would.
- A ```bash block runs under `bash -e -o pipefail`: every command must succeed; its comments are not checked.
- In a ```python block the comment at the end of a `print(...)` call is the output that call must print: words are
  compared (line ends and runs of spaces count as one space), and `...` stands for any text. Every other comment is
  free text. Top-level `await` is allowed.
A failing block fails the test named by its place (`README.md:76`), and the message says how to mark it no-run.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine
from tests.docs.blocks import ROOT
from tests.support.engines import teardown_engine
from tests.support.servers import wait_until_serving

ROLLBOX = Path(sys.executable).with_name("rollbox")
TEMPLATES = ("examples/templates/rl-python.yaml",)
"""What the README applies before its examples."""
STOP_TIMEOUT = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`rollbox serve` on a free loopback port, as the README starts it, with the README's template applied."""
    data = tmp_path_factory.mktemp("docs-server") / "data"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([str(ROLLBOX), "serve", "--port", str(port), "--data-dir", str(data),
                                "--delete-on-exit"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_serving(url, process, "rollbox serve")
        for template in TEMPLATES:
            applied = subprocess.run([str(ROLLBOX), "apply", "-f", template, "--wait", "--url", url], cwd=ROOT,
                                     capture_output=True, text=True, timeout=300)
            assert applied.returncode == 0, applied.stderr
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        if (data / "state.db").exists():  # what a server that could not stop cleanly left
            teardown_engine(Engine(data))
    assert "Traceback" not in stderr, stderr[-3000:]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A working directory for one block: this checkout's `examples/` and `.venv/`, and nothing else of it."""
    for name in ("examples", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path
