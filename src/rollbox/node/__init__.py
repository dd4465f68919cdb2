"""One machine's templates, warm pools, claims and tenants, behind the `Node` interface."""

from rollbox.node.base import FileOp, Node
from rollbox.node.local import LocalNode
from rollbox.node.models import ClaimInfo, ClaimRequest, ExecRequest, TemplateInfo, WarmPoolInfo

__all__ = ["ClaimInfo", "ClaimRequest", "ExecRequest", "FileOp", "LocalNode", "Node", "TemplateInfo",
           "WarmPoolInfo"]
