"""The embedded server, for the main job, benchmarks and tests: `rollbox serve` in a child process (its own
interpreter, so the server never competes with its user for the GIL), reached through the SDK like any remote
router (`server.url`), and leaving nothing running when it stops.

It listens on a unix socket in a directory of its own (mode 0700), not on a loopback port. The server is
open (no tokens) and runs as root: on a loopback port any local user could drive it, run commands in its
sandboxes and, through a template's `copy` step, read the host's files. The socket also costs less per
call than TCP."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rollbox._signals import sigterm_held
from rollbox.errors import RollboxError
from rollbox.server.listen import private_socket_path

_SERVE = "import json, sys; from rollbox.server import serve; serve(**json.loads(sys.argv[1]))"
START_TIMEOUT = 60.0
HEALTH_TIMEOUT = 1.0
STOP_TIMEOUT = 60.0
"""Seconds the server has to stop, deleting its sandboxes, before it is killed."""


class LocalServer:
    """`with LocalServer(data_dir) as server:` gives `server.url`; leaving stops it and deletes its sandboxes."""

    def __init__(self, data_dir: str | Path, *, max_sandboxes: int = 128) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.max_sandboxes = max_sandboxes
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._run_dir: Path | None = None
        self._socket: Path | None = None

    def start(self) -> LocalServer:
        socket_path = self._socket = private_socket_path()
        self._run_dir = socket_path.parent
        options = {"data_dir": str(self.data_dir), "socket": str(socket_path), "max_sandboxes": self.max_sandboxes,
                   "delete_on_exit": True}
        try:
            with sigterm_held():  # a SIGTERM as the child starts acts once `close` can find the child
                self._process = subprocess.Popen([sys.executable, "-c", _SERVE, json.dumps(options)],
                                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
            self.url = f"unix://{socket_path}"
            self._wait_healthy(self._process)
        except BaseException:  # also an interrupt or SIGTERM while it starts: the server must not outlive us
            self.close()
            raise
        return self

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (benchmarks read its CPU time)."""
        return self._process.pid if self._process is not None else None

    def _wait_healthy(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        transport = httpx.HTTPTransport(uds=str(self._socket))
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=HEALTH_TIMEOUT) as http:
            while not _healthy(http):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RollboxError(f"the embedded server on {self.url} did not start; see its output above")
                time.sleep(0.05)

    def close(self) -> None:
        """Stops the server, which deletes every sandbox and snapshot on its data as it goes (templates stay
        cached). A server that could not (it failed, or was killed) leaves that to this process."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        if process.returncode != 0:
            _delete_everything(self.data_dir)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


def _healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def _delete_everything(data_dir: Path) -> None:
    """What the server does when it stops, done here; only then is the engine loaded into this process."""
    from rollbox.engine import Engine
    from rollbox.server.serve import delete_everything

    with contextlib.closing(Engine(data_dir)) as engine:
        delete_everything(engine)
