"""What a router knows of its cluster's nodes at one moment: published whole by the watcher, read by requests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

NodeStatus = Literal["joining", "up", "unreachable", "lost"]
"""joining: answering, templates and warm pools being copied to it; up: serving; unreachable: its agent does not
answer (restarting, or cut off; calls wait a little for it, then it is down); lost: it left the cluster, and its
sandboxes with it."""
RESTART_WAIT = 1.5
"""Seconds after a node agent stops answering during which calls on its sandboxes wait for it to serve again (a
restart: Ray's, or an operator's). After that the node is down: its calls answer 503 node_unavailable at once, marked
not worth sending again, and nginx sends them to the router, until it answers."""


@dataclass(frozen=True, slots=True)
class Member:
    """A node as the cluster engine lists it: where its agent listens, and whether the node is still a member."""

    url: str | None
    """None while its agent starts."""
    name: str | None = None
    """None when only the agent can say (a fixed list of URLs)."""
    alive: bool = True
    incarnation: str | None = None
    """The cluster engine's id for this membership of the node (Ray's node id): a node that leaves and comes back
    has a new one."""


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    url: str | None
    status: NodeStatus
    since: float
    """Monotonic time the node entered `status`."""
    seen: float = 0.0
    """Monotonic time of the look that found it so."""
    max_sandboxes: int = 0
    sandboxes: int = 0
    claims: int = 0
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The node's warm pools as its health reports them: template, replicas, ready, starting."""
    incarnation: str | None = None

    def down(self, now: float | None = None) -> bool:
        """Whether its agent has not answered for RESTART_WAIT."""
        return self.status == "unreachable" and (time.monotonic() if now is None else now) - self.since >= RESTART_WAIT

    def describe(self) -> dict[str, Any]:
        return {"status": self.status, "url": self.url, "sandboxes": self.sandboxes, "claims": self.claims,
                "max_sandboxes": self.max_sandboxes}
