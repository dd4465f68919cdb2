"""Where the router listens: a unix socket path is taken only when it can work, a live server's is never taken
over, and a client's unix URL must be absolute (tests/server/test_unix_socket.py serves on them)."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from rollbox import errors
from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.server.listen import MAX_SOCKET_PATH, listen_unix


def test_a_socket_left_by_a_killed_server_is_replaced_and_a_live_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "router.sock"
    with socket.socket(socket.AF_UNIX) as killed:  # bound, never closed by a server: nobody listens
        killed.bind(str(path))
    listener = listen_unix(path)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with pytest.raises(errors.Conflict, match="already listens"):
            listen_unix(path)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))  # the live one kept its socket
    finally:
        listener.close()


def test_a_socket_path_that_cannot_work_is_refused_with_the_reason(tmp_path: Path) -> None:
    regular = tmp_path / "notes.txt"
    regular.write_text("keep me")
    with pytest.raises(errors.InvalidRequest, match="not a socket"):
        listen_unix(regular)
    assert regular.read_text() == "keep me"
    with pytest.raises(errors.InvalidRequest, match=f"at most {MAX_SOCKET_PATH} bytes"):
        listen_unix(tmp_path / ("x" * 120) / "router.sock")


def test_a_unix_url_needs_an_absolute_path() -> None:
    with pytest.raises(errors.InvalidRequest, match="absolute path"):
        SandboxClient("unix://router.sock")
    with pytest.raises(errors.InvalidRequest, match="absolute path"):
        AsyncSandboxClient("unix://run/router.sock")
