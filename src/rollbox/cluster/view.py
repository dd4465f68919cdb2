"""What a router knows of its cluster's nodes at one moment: published whole by the watcher, read by requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

NodeStatus = Literal["joining", "up", "unreachable", "lost"]
"""joining: answering, templates and warm pools being copied to it; up: serving; unreachable: its agent does not
answer (restarting, or cut off; calls wait a little for it); lost: it left the cluster, and its sandboxes with it."""


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

    def describe(self) -> dict[str, Any]:
        return {"status": self.status, "url": self.url, "sandboxes": self.sandboxes, "claims": self.claims,
                "max_sandboxes": self.max_sandboxes}
