"""The agent clients give up on an agent that stopped answering, the blocking one and the asyncio one alike."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from rollbox.engine import agent_client
from rollbox.engine.agent_client import AgentClient, AgentRequest
from rollbox.errors import SandboxNotRunning


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_agent_that_never_answers_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """An agent that takes the command and then hangs: each client gives up ANSWER_GRACE after the command's
    timeout (the asyncio one used to wait forever, holding its caller's request open)."""
    monkeypatch.setattr(agent_client, "ANSWER_GRACE", 0.2)
    path = tmp_path / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hung:
        hung.bind(str(path))
        hung.listen()  # connections wait in the backlog, and nothing ever reads or answers them
        client = AgentClient(str(path), "c0ffee")
        request = AgentRequest(command=["sleep", "1"], timeout=0.1)
        start = time.monotonic()
        with pytest.raises(SandboxNotRunning, match="container c0ffee"):
            if mode == "sync":
                client.run(request)
            else:
                asyncio.run(client.run_async(request))
        assert 0.3 <= time.monotonic() - start < 5
