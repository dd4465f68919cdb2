"""The async SDK's connection pool (client/_transport.py) on its own, against raw sockets on loopback: how it reads
answers, reports broken and slow ones as httpx errors, times reads, and keeps failures the SDK's ConnectionFailed."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import sys
from collections.abc import Awaitable, Callable

import httpx
import pytest

from rollbox.client import AsyncSandboxClient, ConnectionFailed
from rollbox.client._http import Settings
from rollbox.client._transport import PoolTransport, Reply


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_errors_stay_the_sdks_connection_failed() -> None:
    async def calls() -> None:
        async with AsyncSandboxClient(f"http://127.0.0.1:{_free_port()}", max_connections=1) as client:
            for _ in range(3):  # each failure gives its connection slot back
                with pytest.raises(ConnectionFailed, match=r"cannot reach the rollbox server at .*serve") as caught:
                    await client.create_sandbox(template="basic")
                assert caught.value.code == "connection_failed"
        with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (in the backlog), never answers
            address = f"http://127.0.0.1:{silent.getsockname()[1]}"
            async with AsyncSandboxClient(address, timeout=0.3, max_connections=1) as client:
                for _ in range(2):
                    with pytest.raises(ConnectionFailed, match="did not answer in time"):
                        await client.create_sandbox(template="basic")

    asyncio.run(calls())


def test_a_server_that_hangs_up_mid_call_is_connection_failed() -> None:
    with socket.create_server(("127.0.0.1", 0)) as rude:
        async def hang_up() -> None:
            loop = asyncio.get_running_loop()
            connection, _ = await loop.sock_accept(rude)
            await loop.sock_recv(connection, 65536)
            connection.close()

        async def calls() -> None:
            rude.setblocking(False)
            async with AsyncSandboxClient(f"http://127.0.0.1:{rude.getsockname()[1]}") as client:
                hanging_up = asyncio.create_task(hang_up())
                with pytest.raises(ConnectionFailed, match=r"POST /v1/sandboxes .* failed: Server disconnected"):
                    await client.create_sandbox(template="basic", request_key=None)  # not sent again
                await hanging_up

        asyncio.run(calls())


class _RawServer:
    """A loopback server that answers each request, after `pause` seconds, with the next of `answers` (raw
    bytes); it closes the connection after each answer when `close` is set, and after one whose body has
    neither a length nor chunks. It records the requests it got."""

    def __init__(self, answers: list[bytes], close: bool = False, pause: float = 0.0) -> None:
        self.answers = answers
        self.close = close
        self.pause = pause
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while self.answers:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            self.requests.append(head + await reader.readexactly(length))
            await asyncio.sleep(self.pause)
            answer = self.answers.pop(0)
            writer.write(answer)
            with contextlib.suppress(ConnectionError):  # a client that gave up has closed its end
                await writer.drain()
            framed = b"content-length:" in answer.lower() or b"transfer-encoding:" in answer.lower()
            if self.close or not framed:
                break
        writer.close()


Send = Callable[..., Awaitable[Reply]]
"""`send(method, path, content=None, timeout=None)`: a request through the pool, its reply once the head is in."""


def _transport_run(scripted: _RawServer, calls: Callable[[Send], Awaitable[None]], timeout: float = 5.0) -> None:
    async def run() -> None:
        server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        settings = Settings(url, None, timeout)
        pool = PoolTransport(url, httpx.Limits())

        async def send(method: str, path: str, content: bytes | None = None, timeout: float | None = None) -> Reply:
            timeouts = settings.timeouts() if timeout is None else Settings(url, None, timeout).timeouts()
            return await pool.send(settings.written(method, path, content=content), timeouts)

        async with server:
            try:
                await calls(send)
            finally:
                await pool.aclose()

    asyncio.run(run())


def test_the_transport_reads_lengths_chunks_and_bodies_that_end_at_close() -> None:
    big = b"".join(b"%07d %s\n" % (number, b"x" * 92) for number in range(100_000))  # 10 MB of NDJSON-like lines
    scripted = _RawServer([
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big),
        b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
        b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
    ])

    async def calls(send: Send) -> None:
        reply = await send("GET", "/big")
        lines = []
        async for line in reply.lines():  # read slowly: the transport stops reading while 1 MB waits unread
            lines.append(line)
            await asyncio.sleep(0)
        assert "\n".join(lines) + "\n" == big.decode()
        answer = await send("POST", "/chunked", content=b"sent")
        assert (answer.status_code, answer.reason_phrase, await answer.read()) == (201, "Created", b"abcde")
        assert await (await send("GET", "/until-close")).read() == b"until the end"
        assert (await send("DELETE", "/after")).status_code == 204

    _transport_run(scripted, calls)
    assert scripted.connections == 2  # an answer that ends at close cannot leave its connection open
    assert scripted.requests[0].startswith(b"GET /big HTTP/1.1\r\n")
    assert b"content-length" not in scripted.requests[0]
    assert scripted.requests[1].startswith(b"POST /chunked HTTP/1.1\r\n")
    assert scripted.requests[1].endswith(b"content-length: 4\r\n\r\nsent")


def test_the_transport_reports_broken_and_slow_answers_as_httpx_errors() -> None:
    async def calls(send: Send) -> None:
        with pytest.raises(httpx.RemoteProtocolError, match=r"not valid HTTP/1\.1"):
            await send("GET", "/")
        with pytest.raises(httpx.RemoteProtocolError, match="before the end of the answer"):
            await (await send("GET", "/")).read()

    _transport_run(_RawServer([b"SMTP ready\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"],
                             close=True), calls)

    async def slow(send: Send) -> None:
        with pytest.raises(httpx.ReadTimeout):
            await send("GET", "/")
        assert await (await send("GET", "/", timeout=5.0)).read() == b"ok"
        assert scripted.connections == 2  # the timed-out connection was dropped, not reused

    scripted = _RawServer([b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"] * 2, pause=0.5)
    _transport_run(scripted, slow, timeout=0.2)


def test_a_short_read_timeout_fires_beside_a_long_one_that_set_the_timer_going() -> None:
    """Read deadlines share one timer per pool: a call with a short timeout still gives up before its late answer,
    and the call that waits longer still gets its own."""
    async def calls(send: Send) -> None:
        loop = asyncio.get_running_loop()
        patient = asyncio.ensure_future(send("GET", "/patient", timeout=5.0))
        await asyncio.sleep(0.05)  # its wait is the first: it set the timer going
        started = loop.time()
        with pytest.raises(httpx.ReadTimeout, match=r"no answer from the server in 0\.2 s"):
            await send("GET", "/hasty", timeout=0.2)
        assert loop.time() - started < 0.45, "the short timeout waited for the answer it should have given up on"
        assert await (await patient).read() == b"ok"

    _transport_run(_RawServer([b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"] * 2, pause=0.5), calls)

def test_a_call_abandoned_when_its_loop_closed_is_finalised_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a crashed rollout leaves it: the coroutine is closed later, and its connection goes with the loop."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(30)

    async def start_a_call() -> asyncio.Task[object]:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        client = AsyncSandboxClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        call = asyncio.ensure_future(client.health())
        await asyncio.sleep(0.2)
        return call

    unraisable: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: unraisable.append(info.exc_value))
    loop = asyncio.new_event_loop()
    call = loop.run_until_complete(start_a_call())
    loop.close()
    del call
    gc.collect()
    assert unraisable == []
