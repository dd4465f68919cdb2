"""The async SDK's connection pool (client/_transport.py) against a real router on loopback: bounded, reused,
streams hold their connection and dead connections are dropped. (The pool on its own is in the unit tier.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from rollbox import errors
from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.node import LocalNode
from rollbox.server import create_app, listen
from rollbox.server.threaded import ThreadServer
from tests.support.engines import make_engine, teardown_engine

TEMPLATE = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: basic}
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    engine = make_engine(tmp_path_factory.mktemp("router"))
    node = LocalNode(engine, max_sandboxes=4)
    try:
        yield node
    finally:
        node.close()
        teardown_engine(engine)


@pytest.fixture(scope="module", params=["unix", "tcp"])
def url(node: LocalNode, request: pytest.FixtureRequest) -> Iterator[str]:
    """The router on a unix socket (as the embedded default serves) and on a loopback port."""
    with ThreadServer(create_app(node), tcp=request.param == "tcp") as server:
        yield server.url


def opened(client: AsyncSandboxClient) -> int:
    return client._exchange.transport.connections_opened


def test_many_concurrent_calls_share_fewer_connections(url: str) -> None:
    async def calls() -> None:
        async with AsyncSandboxClient(url, max_connections=8) as client:
            answers = await asyncio.gather(*(client.health() for _ in range(200)))
            assert all(answer.status == "ok" for answer in answers)
            assert 1 <= opened(client) <= 8

    asyncio.run(calls())


def test_one_connection_serves_call_after_call_errors_included(url: str) -> None:
    async def calls() -> None:
        async with AsyncSandboxClient(url) as client:
            for _ in range(20):
                await client.health()
            with pytest.raises(errors.TemplateNotFound):
                await client.create_sandbox(template="no-such-template")
            assert await client.list_sandboxes() == []
            assert opened(client) == 1

    asyncio.run(calls())


def test_a_closed_client_refuses_further_calls(url: str) -> None:
    """Both SDKs: a call after close() is a clear error, not a new connection opened behind the user's back."""
    async def calls() -> None:
        client = AsyncSandboxClient(url)
        await client.health()
        await client.close()
        with pytest.raises(RuntimeError, match="closed"):
            await client.health()
        assert opened(client) == 1

    asyncio.run(calls())
    with SandboxClient(url) as client:
        client.health()
    with pytest.raises(RuntimeError, match="closed"):
        client.health()


def test_a_client_moves_to_the_next_event_loop_but_is_not_shared_with_a_running_one(url: str) -> None:
    """Connections belong to the loop that opened them: a client kept across `asyncio.run` calls starts over on
    the new loop; one used from another thread while its own loop runs is a clear error, not a corrupted pool."""
    client = AsyncSandboxClient(url)
    for _ in range(2):
        asyncio.run(client.health())
    assert opened(client) == 2

    def from_another_thread() -> BaseException | None:
        try:
            asyncio.run(client.health())
        except RuntimeError as error:
            return error
        return None

    async def while_running() -> BaseException | None:
        await client.health()
        return await asyncio.to_thread(from_another_thread)

    error = asyncio.run(while_running())
    assert error is not None and "a client of its own" in str(error)
    assert opened(client) == 3
    asyncio.run(client.close())


def test_a_streamed_exec_holds_its_connection_while_other_calls_proceed(url: str) -> None:
    with SandboxClient(url) as sync_client:
        sync_client.apply(TEMPLATE)

    async def calls() -> None:
        async with (AsyncSandboxClient(url, max_connections=2) as client,
                    client.create_sandbox(template="basic") as sandbox):
            first_line = asyncio.Event()
            chunks: list[tuple[str, float]] = []

            def on_stdout(data: str) -> None:
                chunks.append((data, time.monotonic()))
                first_line.set()

            async def meanwhile() -> float:
                await first_line.wait()
                await asyncio.gather(*(client.health() for _ in range(50)))
                return time.monotonic()

            result, others_done = await asyncio.gather(sandbox.run("echo a; sleep 2; echo b", on_stdout=on_stdout),
                                                       meanwhile())
            assert result.stdout == "".join(data for data, _ in chunks) == "a\nb\n"
            assert [data for data, _ in chunks] == ["a\n", "b\n"]
            assert others_done < chunks[1][1], "the other calls waited for the stream to end"
            assert opened(client) == 2

    asyncio.run(calls())


def test_streamed_calls_give_their_connection_back(url: str) -> None:
    with SandboxClient(url) as sync_client:
        sync_client.apply(TEMPLATE)

    async def calls() -> None:
        async with AsyncSandboxClient(url) as client, client.create_sandbox(template="basic") as sandbox:
            for word in ("one", "two", "three"):
                seen: list[str] = []
                result = await sandbox.run(f"echo {word}", on_stdout=seen.append)
                assert result.stdout == "".join(seen) == f"{word}\n"
            await client.health()
            assert opened(client) == 1

    asyncio.run(calls())


def test_an_idle_connection_the_server_closed_is_not_reused(node: LocalNode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(listen.UVICORN_OPTIONS, "timeout_keep_alive", 0.2)

    async def calls(url: str) -> None:
        async with AsyncSandboxClient(url) as client:
            await client.health()
            await asyncio.sleep(1.0)  # the server drops the idle connection; the client would keep it 5 s
            # Not retried (it changes state): on the dropped connection it would fail as ConnectionFailed.
            with pytest.raises(errors.TemplateNotFound):
                await client.create_sandbox(template="no-such-template")
            assert opened(client) == 2

    with ThreadServer(create_app(node)) as server:
        asyncio.run(calls(server.url))
