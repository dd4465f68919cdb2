"""One machine's templates, warm pools, claims and tenants, behind the `Node` interface."""

from rollbox.node.base import FileOp, Node
from rollbox.node.local import LocalNode

__all__ = ["FileOp", "LocalNode", "Node"]
