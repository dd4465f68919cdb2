"""One sandbox's model gateway: its key, its budgets and the calls it recorded."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from uvicorn.server import ServerState

from rollbox.models import ModelCall
from rollbox.spec import ModelGateway


@dataclass
class Session:
    """One sandbox's gateway: its key, its budgets and what it recorded."""

    sandbox_id: str
    key: str
    config: ModelGateway
    opened_at: float = field(default_factory=time.monotonic)
    calls: list[ModelCall] = field(default_factory=list)
    tokens: int = 0
    open: bool = True
    server: asyncio.Server | None = None
    connections: ServerState = field(default_factory=ServerState)

    def seconds(self) -> float:
        return time.monotonic() - self.opened_at

    def refusal(self) -> str | None:
        """Why the next call is refused, if a budget is spent."""
        config = self.config
        if config.max_requests is not None and len(self.calls) >= config.max_requests:
            return f"the episode's budget of {config.max_requests} model calls is spent"
        if config.max_tokens is not None and self.tokens >= config.max_tokens:
            return f"the episode's budget of {config.max_tokens} tokens is spent ({self.tokens} used)"
        if config.max_seconds is not None and self.seconds() >= config.max_seconds:
            return f"the episode's budget of {config.max_seconds:g} seconds is spent"
        return None
