"""Where a rollbox server listens, and how it runs uvicorn there: a loopback or any TCP port, or a unix socket only
its user may connect to. The router, the SandboxFusion gateway, the embedded server and the benchmarks all
listen through these, so the socket rules hold for each."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket as sockets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from rollbox.errors import Conflict, InvalidRequest

KEEP_ALIVE = 75.0
"""Seconds an idle connection stays open: longer than clients' pools keep them, so a request never races a close."""
UVICORN_OPTIONS = {"access_log": False, "timeout_keep_alive": KEEP_ALIVE, "proxy_headers": False,
                   "server_header": False}
"""How every rollbox server runs uvicorn. No proxy-header rewriting (clients reach the router directly) and no
server header: a few microseconds of every request's share of the one event loop."""
MAX_SOCKET_PATH = 107
"""Bytes a unix socket's path may have (sun_path holds 108 with its terminating NUL)."""


@contextlib.contextmanager
def listening(socket: Path | None) -> Iterator[sockets.socket | None]:
    """A listening unix socket at `socket` (see listen_unix), removed on exit; None for none."""
    if socket is None:
        yield None
        return
    listener = listen_unix(socket)
    try:
        yield listener
    finally:  # only a socket this server made goes
        listener.close()
        socket.unlink(missing_ok=True)


def run_app(app: Any, host: str, port: int, listener: sockets.socket | None, log_level: str) -> None:
    """Serves `app` with uvicorn until SIGINT/SIGTERM: on `listener` when given, else on `host`:`port`."""
    if listener is None:
        uvicorn.run(app, host=host, port=port, log_level=log_level, **UVICORN_OPTIONS)
    else:
        server(app, log_level).run(sockets=[listener])


def server(app: Any, log_level: str) -> uvicorn.Server:
    """A uvicorn server of `app`, for callers that run it on their own event loop (`await server.serve(...)`),
    next to work of their own."""
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, **UVICORN_OPTIONS))


def listen_tcp(host: str, port: int) -> sockets.socket:
    """A listening socket on `host`:`port` (port 0: a free one), so that the port is known, and taken, before
    serving starts."""
    family = sockets.AF_INET6 if ":" in host else sockets.AF_INET
    try:
        return sockets.create_server((host, port), family=family, backlog=2048)
    except OSError as error:
        raise InvalidRequest(f"cannot listen on {host}:{port}: {error.strerror or error}: choose another --port "
                             "or --host") from None


def listen_unix(path: Path) -> sockets.socket:
    """A listening unix socket at `path` that only this process's user may connect to (mode 0600).

    A missing directory is made, for this user only (0700). A socket file left by a server that was killed is
    replaced; one a live server listens on is not."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise InvalidRequest(f"{path}: a unix socket's path has at most {MAX_SOCKET_PATH} bytes: choose a shorter one")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise InvalidRequest(f"cannot make {path.parent} for the socket: {error.strerror}") from None
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise InvalidRequest(f"{path} exists and is not a socket: choose another path")
        with sockets.socket(sockets.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                path.unlink()  # nobody listens: left by a server that was killed
            else:
                raise Conflict(f"a server already listens on {path}: stop it first, or choose another path")
    listener = sockets.socket(sockets.AF_UNIX)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o600)  # before listen(): until then nobody can connect, so no one slips in meanwhile
        listener.listen(2048)
    except OSError as error:
        listener.close()
        raise InvalidRequest(f"cannot listen on {path}: {error.strerror}") from None
    except BaseException:
        listener.close()
        raise
    return listener


def private_socket_path() -> Path:
    """A socket path in a fresh directory only this user may enter (mkdtemp makes it 0700), short enough for a
    socket's path limit. Remove the directory when done."""
    return Path(tempfile.mkdtemp(prefix="rollbox-")) / "router.sock"


@contextlib.contextmanager
def private_listener(tcp: bool = False) -> Iterator[tuple[sockets.socket, str]]:
    """A listening socket and the URL that reaches it: `router.sock` (0600) in a fresh directory only this user may
    enter, removed on exit; with `tcp`, a free loopback port."""
    if tcp:
        with listen_tcp("127.0.0.1", 0) as listener:
            yield listener, f"http://127.0.0.1:{listener.getsockname()[1]}"
        return
    path = private_socket_path()
    try:
        with listen_unix(path) as listener:
            yield listener, f"unix://{path}"
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
