"""The embedded default for the main job, benchmarks and tests: `rollbox serve` in a child process (its own
interpreter, so the server never competes with the trainer for the GIL), reached through the SDK like any
remote router.

It listens on a unix socket in a directory of its own (mode 0700), not on a loopback port. The server is
open (no tokens) and runs as root: on a loopback port any local user could drive it, run commands in its
sandboxes and, through a template's `copy` step, read the host's files. The socket also costs less per
call than TCP."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from rollbox.client._http import Settings
from rollbox.engine import Engine
from rollbox.errors import RollboxError

_SERVE = "import json, sys; from rollbox.server import serve; serve(**json.loads(sys.argv[1]))"
START_TIMEOUT = 60.0
HEALTH_TIMEOUT = 1.0
STOP_TIMEOUT = 30.0


class LocalServer:
    """`with LocalServer(data_dir) as server:` gives `server.url`; leaving stops it and deletes its sandboxes."""

    def __init__(self, data_dir: str | Path, *, max_sandboxes: int = 128) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.max_sandboxes = max_sandboxes
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._run_dir: Path | None = None

    def start(self) -> LocalServer:
        self._run_dir = Path(tempfile.mkdtemp(prefix="rollbox-"))  # 0700, and short enough for a socket's path
        socket_path = self._run_dir / "router.sock"
        options = {"data_dir": str(self.data_dir), "socket": str(socket_path), "max_sandboxes": self.max_sandboxes}
        self._process = subprocess.Popen([sys.executable, "-c", _SERVE, json.dumps(options)],
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = f"unix://{socket_path}"
        deadline = time.monotonic() + START_TIMEOUT
        settings = Settings(self.url, None, HEALTH_TIMEOUT)
        with settings.http_client(1) as http:
            while not _healthy(http, settings):
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RollboxError(f"the embedded server on {self.url} did not start; see its output above")
                time.sleep(0.05)
        return self

    def close(self) -> None:
        """Stops the server, then deletes every sandbox and snapshot on its data (templates stay cached)."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        with Engine(self.data_dir) as engine:
            engine.destroy_all()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


def _healthy(http: httpx.Client, settings: Settings) -> bool:
    try:
        return http.send(settings.request("GET", "/healthz")).status_code == 200
    except httpx.TransportError:
        return False


class ThreadServer:
    """An ASGI app (the SandboxFusion gateway, say) on a free loopback port, served from a thread."""

    def __init__(self, app: Any) -> None:
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                     access_log=False, lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, name="rollbox-thread-server", daemon=True)
        self.url = ""

    def __enter__(self) -> ThreadServer:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RollboxError("the ASGI app did not start serving; see the log above")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self._server.servers[0].sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join()
