"""An ASGI app served from a thread of this process: the demo's router, the SandboxFusion gateway, tests.

By default it listens on a unix socket in a directory of its own (mode 0700). These servers run open (no
tokens) and usually as root: on a loopback port any local user could drive them. `tcp=True` takes a free
loopback port instead, for clients that only speak TCP (SandboxFusion's): serve those behind a
rollbox.server.capability.SecretPath."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import uvicorn

from rollbox.errors import RollboxError
from rollbox.server.listen import UVICORN_OPTIONS, private_listener

START_TIMEOUT = 60.0


class ThreadServer:
    """`with ThreadServer(app) as server:` serves `app` at `server.url` until the block ends."""

    def __init__(self, app: Any, *, tcp: bool = False) -> None:
        self._app = app
        self._tcp = tcp
        self._stack = contextlib.ExitStack()
        self.url = ""

    def __enter__(self) -> ThreadServer:
        with contextlib.ExitStack() as stack:
            listener, self.url = stack.enter_context(private_listener(self._tcp))
            # read now, not at import: tests tune the options for one server
            server = uvicorn.Server(uvicorn.Config(self._app, log_level="warning", lifespan="off", **UVICORN_OPTIONS))
            thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="rollbox-thread-server",
                                      daemon=True)
            thread.start()
            stack.callback(_stop, server, thread)
            deadline = time.monotonic() + START_TIMEOUT
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    raise RollboxError("the ASGI app did not start serving; see the log above")
                time.sleep(0.01)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *_: object) -> None:
        self._stack.close()


def _stop(server: uvicorn.Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join()
