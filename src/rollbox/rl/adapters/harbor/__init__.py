"""Harbor's environments on rollbox (docs/harbor.md): `harbor run --env rollbox.rl.adapters.harbor:RollboxEnvironment`.

`RollboxEnvironment` needs the `harbor` package (Python 3.12 or newer); `templates` and `account` do not, and
are imported without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RollboxEnvironment"]


def __getattr__(name: str) -> Any:
    """`RollboxEnvironment` is imported when asked for, so that the Harbor-free modules load without Harbor."""
    if name == "RollboxEnvironment":
        from rollbox.rl.adapters.harbor.environment import RollboxEnvironment

        return RollboxEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
