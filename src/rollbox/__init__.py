"""rollbox: isolated, stateful sandboxes for reinforcement learning of code agents."""

from typing import Any

from rollbox._version import __version__

__all__ = ["AsyncSandboxClient", "SandboxClient", "__version__"]

_SDK = ("SandboxClient", "AsyncSandboxClient")


def __getattr__(name: str) -> Any:
    """`from rollbox import SandboxClient` loads the SDK only when asked, so the engine never pulls in httpx."""
    if name in _SDK:
        from rollbox import client

        return getattr(client, name)
    raise AttributeError(f"module 'rollbox' has no attribute {name!r}")
