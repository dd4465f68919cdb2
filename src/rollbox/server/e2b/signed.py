"""E2B's signed file URLs (`download_url`, `upload_url`): a file read or written by whoever holds the URL, with no
token and no sandbox named.

The SDK signs `path:operation:user:<the sandbox's access token>[:expiry]` with SHA-256. With `E2B_SANDBOX_URL`
pointed at the router, the URL names no sandbox: the router finds it by the signature, among the live sandboxes
of every tenant it knows, and a signature that matches none opens nothing. So a signed URL stays as strong as the
access token it was signed with, and as short-lived as its expiry says.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping

from rollbox.errors import RollboxError, Unauthorized
from rollbox.node import Node
from rollbox.server.e2b.access import Access
from rollbox.server.e2b.caller import Sandbox


class Expired(Unauthorized):
    pass


def signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    """The signature E2B's SDK puts on a URL (`e2b.sandbox.signature.get_signature`)."""
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration is not None else "")
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()


class SignedUrls:
    def __init__(self, node: Node, access: Access) -> None:
        self.node = node
        self.access = access

    async def holder(self, query: Mapping[str, str], operation: str) -> Sandbox:
        """The sandbox whose access token signed this URL for `operation`; Unauthorized when none did."""
        expiration = _expiration(query.get("signature_expiration"))
        if expiration is not None and expiration < time.time():
            raise Expired("signature is already expired")
        sent = query.get("signature", "")
        path, user = query.get("path", ""), query.get("username", "")
        for tenant in sorted(self.access.tenants.names):
            try:
                claims = await self.node.claims(tenant)
            except RollboxError:
                continue
            for info in claims:
                expected = signature(path, operation, user, self.access.token(tenant, info.id), expiration)
                if hmac.compare_digest(sent, expected):
                    return Sandbox(tenant, info.id)
        raise Unauthorized("invalid signature: the URL was not signed by a live sandbox's access token")


def _expiration(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise Unauthorized("the signature's expiration is not a number of seconds") from None
