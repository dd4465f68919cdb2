"""The HTTP API of docs/api.md: auth, routing to a node, streaming, metrics, OpenAPI.

For the CLI (`rollbox serve`)::

    serve(data_dir="/var/lib/rollbox", host="127.0.0.1", port=8080,
          tokens: dict[str, str] | None = None,   # tenant -> token; None runs open as tenant "default"
          max_sandboxes: int = 64,                # every sandbox on the node, warm ones included
          *, tenant_quota: int | None = None,     # claims one tenant may hold at once; None: no quota
          max_body: int = 256 MiB,                # larger request bodies answer 413
          log_level: str = "warning") -> None

It blocks until SIGINT/SIGTERM. Without tokens it only listens on a loopback address (it raises
InvalidRequest otherwise). To embed the API elsewhere, `create_app(node, tokens)` gives the ASGI
app over any `rollbox.node.Node`.
"""

from rollbox.server.app import create_app
from rollbox.server.serve import serve

__all__ = ["create_app", "serve"]
