"""A `rollbox serve` for E2B's SDK: a loopback port, two tenants (alice the admin), the SDK's settings on it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from rollbox.engine import Engine
from tests.support.cluster import Process
from tests.support.engines import teardown_engine
from tests.support.servers import TOKENS


@contextlib.contextmanager
def e2b_server(root: Path) -> Iterator[str]:
    """Yields the server's URL with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (alice's token) set."""
    data_dir = root / "data"
    tokens = [arg for tenant, token in TOKENS.items() for arg in ("--token", f"{tenant}={token}")]
    process = Process(["serve", "--data-dir", str(data_dir), *tokens, "--admin", "alice", "--delete-on-exit"],
                      root / "serve.log")
    saved = dict(os.environ)
    try:
        process.start()
        os.environ.update(E2B_API_URL=process.url, E2B_SANDBOX_URL=process.url, E2B_API_KEY=TOKENS["alice"])
        yield process.url
    finally:
        os.environ.clear()
        os.environ.update(saved)
        process.stop()
        teardown_engine(Engine(data_dir))
