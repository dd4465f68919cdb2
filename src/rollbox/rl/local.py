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
import time
from pathlib import Path

import httpx

from rollbox.client._http import Settings
from rollbox.engine import Engine
from rollbox.errors import RollboxError
from rollbox.server.threaded import private_socket_path

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
        socket_path = private_socket_path()
        self._run_dir = socket_path.parent
        options = {"data_dir": str(self.data_dir), "socket": str(socket_path), "max_sandboxes": self.max_sandboxes}
        self._process = subprocess.Popen([sys.executable, "-c", _SERVE, json.dumps(options)],
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = f"unix://{socket_path}"
        try:
            self._wait_healthy(self._process)
        except BaseException:  # also an interrupt or SIGTERM while it starts: the server must not outlive us
            self.close()
            raise
        return self

    def _wait_healthy(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        settings = Settings(self.url, None, HEALTH_TIMEOUT)
        with settings.http_client(1) as http:
            while not _healthy(http, settings):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RollboxError(f"the embedded server on {self.url} did not start; see its output above")
                time.sleep(0.05)

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
            engine.destroy()  # its sandboxes and snapshots, and its cgroups and run directory with them

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


def _healthy(http: httpx.Client, settings: Settings) -> bool:
    try:
        return http.send(settings.request("GET", "/healthz")).status_code == 200
    except httpx.TransportError:
        return False
