"""SandboxClaims over any `Node`: created, found by name, listed and deleted as agent-sandbox's controller would.

The claim name is the Kubernetes object's name, chosen by the client; the sandbox id is rollbox's, and the Sandbox
object's name. They stay apart: a claim finds its sandbox through the reserved labels it was created with.
A claim that fails before it has a sandbox (its warm pool does not exist) is kept here, in this router's
memory, for a little while: long enough for the client's watch to read why and delete it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rollbox.errors import Conflict, InvalidRequest, NotFound, SandboxNotFound, TemplateNotFound
from rollbox.models import ClaimRequest, SandboxInfo
from rollbox.node import Node
from rollbox.server.agent_sandbox.objects import (
    CLAIM_NAME_LABEL,
    CLAIM_NAMESPACE_LABEL,
    DEFAULT_POD_IP,
    RESERVED_LABEL_PREFIX,
    Claim,
    namespace_of,
)

FAILED_CLAIM_TTL = 600.0
"""Seconds a failed claim is remembered when nobody deletes it."""
FAILED_CLAIMS_KEPT = 10_000
"""Failed claims remembered at most (the oldest go first), so that a flood of them cannot grow the router."""
NAMESPACES_KEPT = 10_000
"""Sandboxes whose namespace the data plane remembers (a sandbox never changes namespace)."""
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SUPPORTED_SPEC = {"warmPoolRef", "lifecycle", "env", "additionalPodMetadata", "volumeClaimTemplates"}


class Invalid(InvalidRequest):
    """A claim Kubernetes would refuse (422 Invalid), naming the field."""

    status = 422


class AlreadyExists(Conflict):
    pass


class Claims:
    """The tenant-scoped claims of one node (or cluster), by namespace and name."""

    def __init__(self, node: Node, pod_addresses: Callable[[str, SandboxInfo], str] | None = None,
                 forget_pod: Callable[[str], None] | None = None) -> None:
        """`pod_addresses`: a sandbox's pod IP for its tenant (pods.py); `forget_pod` is told of deleted sandboxes."""
        self._node = node
        self._pod_address = pod_addresses
        self._forget_pod = forget_pod
        self._failed: OrderedDict[tuple[str, str, str], tuple[Claim, float]] = OrderedDict()
        self._creating: set[tuple[str, str, str]] = set()
        self._namespaces: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._changed = asyncio.Event()

    # -- reading ----------------------------------------------------------------------------------

    def pod_ip(self, tenant: str, info: SandboxInfo) -> str:
        return self._pod_address(tenant, info) if self._pod_address is not None else DEFAULT_POD_IP

    async def all(self, tenant: str, namespace: str | None) -> list[Claim]:
        """The tenant's claims in `namespace` (None: every namespace), oldest first."""
        found: dict[tuple[str, str], Claim] = {}
        for info in sorted(await self._node.claims(tenant), key=lambda info: info.created_at):
            if CLAIM_NAME_LABEL not in info.labels:
                continue  # made through rollbox's own API: a sandbox, but no SandboxClaim
            claim = Claim.of(info)
            claim.pod_ip = self.pod_ip(tenant, info)
            if namespace is None or claim.namespace == namespace:
                found.setdefault((claim.namespace, claim.name), claim)  # a fork copies the labels: the oldest is it
        now = time.monotonic()
        for (owner, claim_namespace, name), (claim, expires) in list(self._failed.items()):
            if expires < now:
                del self._failed[(owner, claim_namespace, name)]
            elif owner == tenant and namespace in (None, claim_namespace):
                found.setdefault((claim_namespace, name), claim)
        return sorted(found.values(), key=lambda claim: claim.created)

    async def find(self, tenant: str, namespace: str, name: str) -> Claim | None:
        return next((claim for claim in await self.all(tenant, namespace) if claim.name == name), None)

    async def get(self, tenant: str, namespace: str, name: str) -> Claim:
        claim = await self.find(tenant, namespace, name)
        if claim is None:
            raise NotFound(f'sandboxclaims.extensions.agents.x-k8s.io "{name}" not found')
        return claim

    async def sandbox(self, tenant: str, namespace: str, sandbox_id: str) -> SandboxInfo:
        """A sandbox of the tenant in `namespace` (another namespace's, or another tenant's, is not found)."""
        info = await self._node.get(tenant, sandbox_id)
        self._remember(tenant, sandbox_id, namespace_of(info))
        if namespace_of(info) != namespace:
            raise SandboxNotFound(f'sandboxes.agents.x-k8s.io "{sandbox_id}" not found in namespace "{namespace}"')
        return info

    async def check_namespace(self, tenant: str, namespace: str, sandbox_id: str) -> None:
        """Raises unless the sandbox is in `namespace`; remembers the answer, so a data-plane call costs no lookup."""
        known = self._namespaces.get((tenant, sandbox_id))
        if known is None:
            await self.sandbox(tenant, namespace, sandbox_id)
        elif known != namespace:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} is not in namespace {namespace!r}")

    async def changed(self, timeout: float) -> None:
        """Returns when a claim is created or deleted through this router, or after `timeout`."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    # -- writing ----------------------------------------------------------------------------------

    async def create(self, tenant: str, namespace: str, body: dict[str, Any]) -> Claim:
        """Claims a sandbox for a SandboxClaim manifest; an unknown warm pool gives a claim that failed."""
        metadata, spec = _mapping(body, "metadata"), _mapping(body, "spec")
        name = _name(metadata)
        labels = _labels(metadata)
        request = _request(spec, labels)
        key = (tenant, namespace, name)
        if key in self._creating or await self.find(tenant, namespace, name) is not None:
            raise AlreadyExists(f'sandboxclaims.extensions.agents.x-k8s.io "{name}" already exists')
        self._creating.add(key)
        try:
            request.labels = {**labels, CLAIM_NAME_LABEL: name, CLAIM_NAMESPACE_LABEL: namespace}
            try:
                info = await self._node.claim(tenant, request)
            except TemplateNotFound as error:
                return self._fail(key, spec, labels, metadata, "TemplateNotFound", str(error))
            except NotFound as error:
                return self._fail(key, spec, labels, metadata, "WarmPoolNotFound", str(error))
        finally:
            self._creating.discard(key)
        self._remember(tenant, info.id, namespace)
        claim = Claim.of(info)
        claim.spec, claim.annotations = spec, _strings(metadata.get("annotations"), "metadata.annotations")
        self._touch()
        return claim

    async def delete(self, tenant: str, namespace: str, name: str, uid: str | None = None) -> Claim:
        claim = await self.get(tenant, namespace, name)
        if uid is not None and uid != claim.uid:
            raise Conflict(f'Precondition failed: UID in precondition: {uid}, UID in object meta: {claim.uid}')
        if claim.info is None:
            self._failed.pop((tenant, namespace, name), None)
        else:
            try:
                await self._node.delete(tenant, claim.info.id)
            except SandboxNotFound:
                raise NotFound(f'sandboxclaims.extensions.agents.x-k8s.io "{name}" not found') from None
            self._namespaces.pop((tenant, claim.info.id), None)
            if self._forget_pod is not None:
                self._forget_pod(claim.info.id)
        self._touch()
        return claim

    def _fail(self, key: tuple[str, str, str], spec: dict[str, Any], labels: dict[str, str],
              metadata: dict[str, Any], reason: str, message: str) -> Claim:
        claim = Claim(key[2], key[1], time.time(), str(uuid.uuid4()), labels, spec, failure=(reason, message),
                      annotations=_strings(metadata.get("annotations"), "metadata.annotations"))
        self._failed[key] = (claim, time.monotonic() + FAILED_CLAIM_TTL)
        while len(self._failed) > FAILED_CLAIMS_KEPT:
            self._failed.popitem(last=False)
        self._touch()
        return claim

    def _remember(self, tenant: str, sandbox_id: str, namespace: str) -> None:
        self._namespaces[(tenant, sandbox_id)] = namespace
        self._namespaces.move_to_end((tenant, sandbox_id))
        while len(self._namespaces) > NAMESPACES_KEPT:
            self._namespaces.popitem(last=False)

    def _touch(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


# -- reading a manifest --------------------------------------------------------------------------------

def _mapping(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key) or {}
    if not isinstance(value, dict):
        raise Invalid(f"{key}: must be an object")
    return value


def _name(metadata: dict[str, Any]) -> str:
    name = metadata.get("name")
    if not name and metadata.get("generateName"):
        name = f"{metadata['generateName']}{secrets.token_hex(3)[:5]}"
    if not isinstance(name, str) or not name:
        raise Invalid("metadata.name: Required value: name or generateName is required")
    if not _DNS_NAME.match(name):
        raise Invalid(f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of '
                      "lower case alphanumeric characters, '-' or '.'")
    return name


def _labels(metadata: dict[str, Any]) -> dict[str, str]:
    labels = _strings(metadata.get("labels"), "metadata.labels")
    reserved = sorted(key for key in labels if key.startswith(RESERVED_LABEL_PREFIX))
    if reserved:
        raise Invalid(f"metadata.labels: {reserved[0]!r}: labels under {RESERVED_LABEL_PREFIX} are rollbox's own")
    return labels


def _strings(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Invalid(f"{where}: must map strings to strings")
    return dict(value)


def _request(spec: dict[str, Any], labels: dict[str, str]) -> ClaimRequest:
    unknown = sorted(set(spec) - _SUPPORTED_SPEC)
    if unknown:
        raise Invalid(f"spec.{unknown[0]}: unknown field")
    for unsupported in ("additionalPodMetadata", "volumeClaimTemplates"):
        if spec.get(unsupported):
            raise Invalid(f"spec.{unsupported}: not supported by rollbox: a sandbox is no pod and has no persistent "
                          "volume claims (rollbox's named volumes are declared on its own templates)")
    pool = _mapping(spec, "warmPoolRef").get("name")
    if not isinstance(pool, str) or not pool:
        raise Invalid("spec.warmPoolRef.name: Required value")
    return ClaimRequest(warmpool=pool, shutdown_after=_shutdown_after(spec.get("lifecycle")), env=_env(spec.get("env")))


def _shutdown_after(lifecycle: Any) -> float | None:
    if not lifecycle:
        return None
    if not isinstance(lifecycle, dict):
        raise Invalid("spec.lifecycle: must be an object")
    if lifecycle.get("ttlSecondsAfterFinished") is not None:
        raise Invalid("spec.lifecycle.ttlSecondsAfterFinished: not supported by rollbox: a sandbox has no end of its "
                      "own; use shutdownTime")
    policy = lifecycle.get("shutdownPolicy", "Delete")
    if policy != "Delete":
        raise Invalid(f'spec.lifecycle.shutdownPolicy: Unsupported value: "{policy}": rollbox supports "Delete" only '
                      "(the claim and its sandbox go together)")
    when = lifecycle.get("shutdownTime")
    if when is None:
        return None
    try:
        moment = datetime.fromisoformat(str(when).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise Invalid(f'spec.lifecycle.shutdownTime: Invalid value: "{when}": use RFC 3339') from None
    if moment <= time.time():
        raise Invalid(f'spec.lifecycle.shutdownTime: Invalid value: "{when}": it has passed')
    return max(1.0, moment - time.time())


def _env(env: Any) -> dict[str, str] | None:
    if not env:
        return None
    if not isinstance(env, list):
        raise Invalid("spec.env: must be a list of {name, value}")
    values = {}
    for index, item in enumerate(env):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise Invalid(f"spec.env[{index}].name: Required value")
        if item.get("containerName"):
            raise Invalid(f"spec.env[{index}].containerName: not supported by rollbox: a sandbox has one container")
        values[item["name"]] = str(item.get("value", ""))
    return values

