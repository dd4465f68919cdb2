"""The node's model gateway: for each claim that asks for one, an OpenAI-compatible address inside the sandbox.

The address is `http://127.0.0.1:<PORT>/v1` in the sandbox's own network namespace: the node binds a socket there
(`Engine.listen`) and serves it on its event loop, with the HTTP protocol of uvicorn and the app of `app.py`. Each
sandbox has its own socket, so the gateway knows which sandbox a connection comes from without believing anything
the sandbox says; its key (`OPENAI_API_KEY` in the claim's environment) must match as well. Nothing else of the
host is reachable: the namespace still has loopback alone, and a sandbox without a gateway has nothing there.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from typing import TYPE_CHECKING

import aiohttp
import uvicorn
from anyio import to_thread
from uvicorn.server import ServerState

from rollbox.errors import InvalidRequest, NotFound, TemplateNotFound
from rollbox.models import ModelCallLog
from rollbox.node.gateway.app import gateway_app
from rollbox.node.gateway.session import Session
from rollbox.spec import ModelGateway

if TYPE_CHECKING:
    from rollbox.engine import Engine

HOST = "127.0.0.1"
PORT = 80
"""Privileged: a sandbox's processes have no capabilities, so none of them can take the address first."""
BASE_URL = "http://127.0.0.1/v1"


class Gateway:
    """The model gateways of one node's sandboxes. `open` runs on the node's event loop; `move` and `close` may
    come from any thread."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions: dict[str, Session] = {}
        self._defaults: dict[str, ModelGateway | None] = {}
        """Each template's `modelGateway`, read once (until a template is applied or deleted)."""
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: aiohttp.ClientSession | None = None
        app = gateway_app(self.session, lambda: self.client)
        self._config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, http="httptools")
        self._config.load()

    @property
    def client(self) -> aiohttp.ClientSession:
        """Calls to the upstreams, pooled (made on the event loop at the first open)."""
        assert self._client is not None
        return self._client

    def session(self, sandbox_id: str) -> Session | None:
        return self._sessions.get(sandbox_id)

    def config_for(self, asked: ModelGateway | None, template: str) -> ModelGateway | None:
        """A claim's gateway: its own, else its template's default, else none."""
        if asked is not None:
            return asked
        if template not in self._defaults:
            try:
                self._defaults[template] = self.engine.template(template).spec.model_gateway
            except TemplateNotFound:  # deleted while its warm sandboxes wait: they were made without one
                return None
        return self._defaults[template]

    def forget_templates(self) -> None:
        """A template was applied or deleted: read the defaults again."""
        self._defaults.clear()

    async def open(self, sandbox_id: str, container_id: str, config: ModelGateway) -> dict[str, str]:
        """Starts the sandbox's gateway; the environment that points its processes at it."""
        self._loop = asyncio.get_running_loop()
        if self._client is None:
            self._client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0),
                                                 timeout=aiohttp.ClientTimeout(total=600.0, connect=10.0))
        session = Session(sandbox_id, "rbx-" + secrets.token_urlsafe(32), config)
        await self._serve(session, container_id)
        with self._lock:
            self._sessions[sandbox_id] = session
        return {"OPENAI_BASE_URL": BASE_URL, "OPENAI_API_KEY": session.key}

    async def _serve(self, session: Session, container_id: str) -> None:
        listener = await to_thread.run_sync(self.engine.listen, container_id, HOST, PORT)
        loop = asyncio.get_running_loop()
        state = {"sandbox": session.sandbox_id}

        def protocol() -> asyncio.Protocol:
            return self._config.http_protocol_class(config=self._config, server_state=session.connections,
                                                    app_state=state, _loop=loop)

        session.server = await loop.create_server(protocol, sock=listener)

    def move(self, sandbox_id: str, container_id: str) -> None:
        """Serves the sandbox's gateway in its new container (after a reset); from a worker thread."""
        session = self._sessions.get(sandbox_id)
        if session is None or self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._move(session, container_id), self._loop).result()

    async def _move(self, session: Session, container_id: str) -> None:
        _stop(session)
        session.connections = ServerState()
        await self._serve(session, container_id)

    def close(self, sandbox_id: str) -> None:
        """Ends the sandbox's gateway: its key is refused from now on, and its connections are cut."""
        with self._lock:
            session = self._sessions.pop(sandbox_id, None)
        if session is None:
            return
        session.open = False
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_stop, session)

    def log(self, sandbox_id: str, offset: int = 0) -> ModelCallLog:
        if offset < 0:
            raise InvalidRequest(f"offset {offset} is negative: give the number of calls already read")
        session = self._sessions.get(sandbox_id)
        if session is None:
            raise NotFound(f"sandbox {sandbox_id} has no model gateway: claim it with model_gateway")
        return ModelCallLog(calls=session.calls[offset:], count=len(session.calls), tokens=session.tokens,
                            seconds=session.seconds(), open=session.open)

    def shutdown(self) -> None:
        """Ends every gateway (the node stops)."""
        for sandbox_id in list(self._sessions):
            self.close(sandbox_id)
        if self._client is not None and self._loop is not None and not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop)


def _stop(session: Session) -> None:
    """Stops listening and cuts the connections (on the event loop): the socket no longer holds the namespace."""
    if session.server is not None:
        session.server.close()
        session.server = None
    for connection in list(session.connections.connections):
        connection.shutdown()
