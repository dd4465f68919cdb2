"""The HTTP API of docs/api.md: auth, routing to a node, streaming, metrics, OpenAPI.

For the CLI (`rollbox serve`)::

    serve(data_dir="/var/lib/rollbox", host="127.0.0.1", port=8080,
          tokens: dict[str, str] | None = None,   # tenant -> token; None runs open as tenant "default"
          max_sandboxes: int = 64,                # every sandbox on the node, warm ones included
          *, socket: str | Path | None = None,    # a unix socket (0600) to listen on instead of host and port
          admins: Iterable[str] = (),             # tenants whose tokens may change templates and pools
          tenant_quota: int | None = None,        # claims one tenant may hold at once; None: no quota
          max_body: int = 256 MiB,                # larger request bodies answer 413
          log_level: str = "warning",
          delete_on_exit: bool = False) -> None  # when stopped, delete every sandbox, claim and snapshot

It blocks until SIGINT/SIGTERM, then leaves its sandboxes running for the next server on `data_dir` to
adopt (saying how many on stderr), unless `delete_on_exit`. Without tokens it only listens on a loopback
address or a socket (it raises InvalidRequest otherwise). To embed the API elsewhere,
`create_app(node, tokens)` gives the ASGI app over any `rollbox.node.Node`.
"""

from importlib import import_module
from typing import Any

__all__ = ["create_app", "serve"]


def __getattr__(name: str) -> Any:
    """Loads the app (and with it the node and engine) only when asked, so that `rollbox.server.local`, the
    embedded server, costs its users no engine."""
    if name in __all__:
        value = getattr(import_module(f"rollbox.server.{'app' if name == 'create_app' else 'serve'}"), name)
        globals()[name] = value  # importing rollbox.server.serve bound the module to this name: the function wins
        return value
    raise AttributeError(f"module 'rollbox.server' has no attribute {name!r}")
