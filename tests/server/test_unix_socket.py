"""The router on a unix socket: the embedded server's only door, closed to every other local user."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import stat
from pathlib import Path
from typing import Any

import yaml

from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.engine import Engine
from rollbox.server.local import LocalServer
from rollbox.server.threaded import ThreadServer
from tests.support.engines import BASIC, leftovers, teardown_engine
from tests.support.users import NOBODY, connect_as

TEMPLATE = {"apiVersion": "rollbox.dev/v1alpha1", "kind": "SandboxTemplate", **BASIC}


def test_the_embedded_server_listens_on_a_socket_only_its_user_can_reach(tmp_path: Path) -> None:
    """An open server run by root on a loopback port would let any local user run commands in its sandboxes
    and read the host's files through a template's `copy`: the embedded one takes a 0600 socket in a 0700
    directory instead, and both clients reach it there."""
    server = LocalServer(tmp_path / "data")
    try:
        server.start()
        assert server.url.startswith("unix:///")
        path = server.url.removeprefix("unix://")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700

        assert connect_as(NOBODY, path) == errno.EACCES
        assert connect_as(os.getuid(), path) == 0  # the same child, as the server's own user, gets in

        with SandboxClient(server.url) as client:
            client.apply(yaml.safe_dump(TEMPLATE))
            with client.create_sandbox(template="basic") as sandbox:
                assert sandbox.commands.run("echo over the socket").stdout == "over the socket\n"
            client.create_sandbox(template="basic")  # left claimed: closing the server deletes it

        async def claim_async() -> str:
            async with AsyncSandboxClient(server.url) as client, client.create_sandbox(template="basic") as sandbox:
                return (await sandbox.commands.run(["cat", "/etc/hostname"])).stdout

        assert asyncio.run(claim_async()).strip()
    finally:
        server.close()
        left = leftovers(tmp_path / "data")
        teardown_engine(Engine(tmp_path / "data"))
    assert not os.path.exists(os.path.dirname(path)), "closing the server removes its socket's directory"
    assert left == [], "closing the server leaves no container, cgroup or run directory of its engine behind"


def test_an_embedded_server_killed_leaves_its_clean_up_to_its_owner(tmp_path: Path) -> None:
    """A server that could not delete its sandboxes as it stopped (killed, crashed) has them deleted by the
    process that started it."""
    server = LocalServer(tmp_path / "data")
    try:
        server.start()
        with SandboxClient(server.url) as client:
            client.apply(yaml.safe_dump(TEMPLATE))
            client.create_sandbox(template="basic")
        os.kill(server.pid, signal.SIGKILL)
    finally:
        server.close()
        left = leftovers(tmp_path / "data")
        teardown_engine(Engine(tmp_path / "data"))
    assert left == []


async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_an_in_process_server_is_closed_to_other_users_unless_asked_for_tcp() -> None:
    """`rollbox demo` serves its open router from a thread: on the same kind of private socket."""
    with ThreadServer(answer) as server:
        path = server.url.removeprefix("unix://")
        assert server.url.startswith("unix:///") and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert connect_as(NOBODY, path) == errno.EACCES
        assert connect_as(os.getuid(), path) == 0
    assert not os.path.exists(os.path.dirname(path))
    with ThreadServer(answer, tcp=True) as server:  # for clients that speak TCP only (SandboxFusion's)
        assert server.url.startswith("http://127.0.0.1:")

