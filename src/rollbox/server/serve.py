"""`serve()`: the embedded default, router and node in one process on this machine."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket as sockets
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

from rollbox._signals import exit_on_sigterm
from rollbox.engine import DEFAULT_DATA_DIR, Engine
from rollbox.errors import Conflict, InvalidRequest
from rollbox.node import LocalNode
from rollbox.node.store import NodeStore
from rollbox.server.app import DEFAULT_MAX_BODY, create_app
from rollbox.server.auth import Tenants

KEEP_ALIVE = 75.0
"""Seconds an idle connection stays open: longer than clients' pools keep them, so a request never races a close."""
UVICORN_OPTIONS = {"access_log": False, "timeout_keep_alive": KEEP_ALIVE, "proxy_headers": False,
                   "server_header": False}
"""How every rollbox server runs uvicorn. No proxy-header rewriting (clients reach the router directly) and no
server header: a few microseconds of every request's share of the one event loop."""


log = logging.getLogger("rollbox.server")

MAX_SOCKET_PATH = 107
"""Bytes a unix socket's path may have (sun_path holds 108 with its terminating NUL)."""


def serve(data_dir: str | Path = DEFAULT_DATA_DIR, host: str = "127.0.0.1", port: int = 8080,
          tokens: dict[str, str] | None = None, max_sandboxes: int = 64, *, socket: str | Path | None = None,
          admins: Iterable[str] = (), tenant_quota: int | None = None, max_body: int = DEFAULT_MAX_BODY,
          log_level: str = "warning", delete_on_exit: bool = False) -> None:
    """Serves the HTTP API until interrupted (SIGINT/SIGTERM); sandboxes and claims outlive it, for the next server
    on `data_dir` to adopt, unless `delete_on_exit` (see delete_everything).

    `socket` serves on that unix socket instead of `host` and `port`: only its owner may connect, and it costs
    less per call than loopback TCP. `admins` names the tenants whose tokens may change templates and warm pools
    (open: everyone)."""
    if not tokens and socket is None and not _loopback(host):
        raise InvalidRequest(f"refusing to listen on {host} without tokens: anyone could run commands. "
                             "Give tokens (--token TENANT=TOKEN) or listen on 127.0.0.1")
    if not tokens and socket is None:
        log.warning("open server on %s:%s: every user of this machine may connect and run commands. "
                    "On a shared machine listen on a socket (--socket PATH) or give tokens", host, port)
    admins = tuple(admins)
    Tenants(tokens, admins)  # a mistake in them fails here, before the data directory is touched
    exit_on_sigterm()
    engine = Engine(data_dir)
    try:
        with listening(Path(socket) if socket is not None else None) as listener:
            node = LocalNode(engine, max_sandboxes=max_sandboxes, tenant_quota=tenant_quota)
            try:
                run_app(create_app(node, tokens, admins=admins, max_body=max_body), host, port, listener, log_level)
            finally:
                node.close()
                if delete_on_exit:
                    with _signals_held():
                        delete_everything(engine)
                else:
                    _tell_what_stays(engine)
    finally:
        engine.close()


def delete_everything(engine: Engine) -> None:
    """Leaves nothing of the data directory running: deletes every sandbox, claim and snapshot, then every
    container, mount, cgroup and run directory still left. Templates, their layers and warm pools stay (a pool
    refills at the next start). Only while no node runs on the directory."""
    engine.destroy()
    store = NodeStore(engine.data_dir / "node.db")
    try:
        store.put_claims((), deleted=store.claims())
        store.remove_pool_containers(container_id for container_id, _ in store.pool_containers())
        for tenant, name, _ in store.snapshots():
            store.delete_snapshot(tenant, name)
    finally:
        store.close()


def _tell_what_stays(engine: Engine) -> None:
    """Says how many sandboxes outlive the server, who adopts them, and how to delete them instead."""
    running = len(engine.list())
    store = NodeStore(engine.data_dir / "node.db")
    try:
        claimed = min(len(store.claims()), running)
    finally:
        store.close()
    where = f"--data-dir {engine.data_dir}"
    if not running:
        log.warning("rollbox serve stopped; no sandbox stays running")
        return
    log.warning("rollbox serve stopped; %d sandboxes stay running (%d claimed, %d warm): the next `rollbox serve "
                "%s` adopts them. To delete them instead, run `rollbox down %s`, or serve with --delete-on-exit",
                running, claimed, running - claimed, where, where)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ignores SIGINT and SIGTERM meanwhile (in the main thread, where signals land): a second Ctrl-C must not
    leave a deletion half done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


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
        uvicorn.Server(uvicorn.Config(app, log_level=log_level, **UVICORN_OPTIONS)).run(sockets=[listener])


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


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
