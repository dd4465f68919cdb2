"""An ASGI app served from a thread of this process: the demo's router, the SandboxFusion gateway, tests.

By default it listens on a unix socket in a directory of its own (mode 0700). These servers run open (no
tokens) and usually as root: on a loopback port any local user could drive them. `tcp=True` takes a free
loopback port instead, for clients that only speak TCP (SandboxFusion's)."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from rollbox.errors import RollboxError
from rollbox.server.serve import UVICORN_OPTIONS, listen_unix

START_TIMEOUT = 60.0


def private_socket_path() -> Path:
    """A socket path in a fresh directory only this user may enter (mkdtemp makes it 0700), short enough for a
    socket's path limit. Remove the directory when done."""
    return Path(tempfile.mkdtemp(prefix="rollbox-")) / "router.sock"


class ThreadServer:
    """`with ThreadServer(app) as server:` serves `app` at `server.url` until the block ends."""

    def __init__(self, app: Any, *, tcp: bool = False) -> None:
        self._app = app
        self._tcp = tcp
        self._socket_path: Path | None = None
        self._listener: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> ThreadServer:
        try:
            self._listen()
            # read now, not at import: tests tune the options for one server
            config = uvicorn.Config(self._app, log_level="warning", lifespan="off", **UVICORN_OPTIONS)
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._listener]},
                                            name="rollbox-thread-server", daemon=True)
            self._thread.start()
            deadline = time.monotonic() + START_TIMEOUT
            while not self._server.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise RollboxError("the ASGI app did not start serving; see the log above")
                time.sleep(0.01)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _listen(self) -> None:
        if self._tcp:
            self._listener = socket.socket()
            self._listener.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        else:
            self._socket_path = private_socket_path()
            self._listener = listen_unix(self._socket_path)
            self.url = f"unix://{self._socket_path}"

    def __exit__(self, *_: object) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join()
        if self._listener is not None:
            self._listener.close()
        if self._socket_path is not None:
            shutil.rmtree(self._socket_path.parent, ignore_errors=True)
