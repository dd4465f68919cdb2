"""`serve()`: the embedded default, router and node in one process on this machine."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from rollbox._signals import exit_on_sigterm
from rollbox.engine import DEFAULT_DATA_DIR, Engine
from rollbox.engine.images.registry import RegistrySettings
from rollbox.errors import InvalidRequest
from rollbox.node import LocalNode
from rollbox.node.local import DEFAULT_SHUTDOWN_AFTER
from rollbox.node.store import NodeStore
from rollbox.server.app import DEFAULT_MAX_BODY, create_app
from rollbox.server.auth import Tenants
from rollbox.server.listen import listening, run_app
from rollbox.server.ports import DEFAULT_DOMAINS
from rollbox.spec import Limits

log = logging.getLogger("rollbox.server")


def serve(data_dir: str | Path = DEFAULT_DATA_DIR, host: str = "127.0.0.1", port: int = 8080,
          tokens: dict[str, str] | None = None, max_sandboxes: int = 64, *, socket: str | Path | None = None,
          admins: Iterable[str] = (), tenant_quota: int | None = None, max_body: int = DEFAULT_MAX_BODY,
          log_level: str = "warning", delete_on_exit: bool = False, registries: RegistrySettings | None = None,
          image_budget: int | None = None, claim_caps: Limits | None = None,
          sandbox_domains: tuple[str, ...] = DEFAULT_DOMAINS, in_cluster: bool = False,
          default_shutdown_after: float | None = DEFAULT_SHUTDOWN_AFTER) -> None:
    """Serves the HTTP API until interrupted (SIGINT/SIGTERM); sandboxes and claims outlive it, for the next server
    on `data_dir` to adopt, unless `delete_on_exit` (see delete_everything).

    `socket` serves on that unix socket instead of `host` and `port`: only its owner may connect, and it costs
    less per call than loopback TCP. `admins` names the tenants whose tokens may change templates and warm pools
    (open: everyone). `registries`, `image_budget` and `claim_caps`: see docs/images.md; `sandbox_domains` and
    `in_cluster`: docs/ports.md and docs/compat-agent-sandbox.md; `default_shutdown_after`: docs/faults.md."""
    if socket is None:
        refuse_open(host, tokens)
    admins = tuple(admins)
    Tenants(tokens, admins)  # a mistake in them fails here, before the data directory is touched
    exit_on_sigterm()
    engine = Engine(data_dir, registries=registries, image_budget=image_budget)
    try:
        with listening(Path(socket) if socket is not None else None) as listener:
            node = LocalNode(engine, max_sandboxes=max_sandboxes, tenant_quota=tenant_quota, claim_caps=claim_caps,
                             default_shutdown_after=default_shutdown_after)
            try:
                run_app(create_app(node, tokens, admins=admins, max_body=max_body, sandbox_domains=sandbox_domains,
                                   in_cluster=in_cluster), host, port, listener, log_level)
            finally:
                node.close()
                if delete_on_exit:
                    with _signals_held():
                        delete_everything(engine)
                else:
                    _tell_what_stays(engine)
    finally:
        engine.close()


def refuse_open(host: str, tokens: dict[str, str] | None) -> None:
    """Refuses to serve without tokens on an address other users or machines reach; warns on loopback."""
    if not tokens and not _loopback(host):
        raise InvalidRequest(f"refusing to listen on {host} without tokens: anyone could run commands. "
                             "Give tokens (--token TENANT=TOKEN) or listen on 127.0.0.1")
    if not tokens:
        log.warning("open server on %s: every user of this machine may connect and run commands. "
                    "On a shared machine listen on a socket (--socket PATH) or give tokens", host)


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


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
