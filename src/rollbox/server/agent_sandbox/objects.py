"""Kubernetes objects of agent-sandbox's API (SandboxClaim, Sandbox, Status), rendered from rollbox's claims.

Nothing here is stored apart from the claim itself: a claim made through this API carries its Kubernetes name
and namespace as two reserved labels, so any router in front of the node (or nodes) sees the same claims,
and a restarted server still has them. Resource versions are derived from the claim's creation time: the claim
as created (no status yet) is `2t`, the claim bound to its ready sandbox `2t + 1`, so a watch from the create
answer's version sees the binding as one MODIFIED event, as it would from agent-sandbox's controller.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rollbox.models import SandboxInfo

CLAIM_GROUP = "extensions.agents.x-k8s.io"
SANDBOX_GROUP = "agents.x-k8s.io"
VERSION = "v1beta1"
CLAIM_API = f"{CLAIM_GROUP}/{VERSION}"
SANDBOX_API = f"{SANDBOX_GROUP}/{VERSION}"

CLAIM_NAME_LABEL = "rollbox.dev/claim-name"
CLAIM_NAMESPACE_LABEL = "rollbox.dev/claim-namespace"
RESERVED_LABEL_PREFIX = "rollbox.dev/"
"""Labels under this prefix are rollbox's own: a claim may not set them, and they are not shown."""
DEFAULT_NAMESPACE = "default"
DEFAULT_POD_IP = "127.0.0.1"
"""A Sandbox's pod IP where it has no address of its own (server/agent_sandbox/pods.py gives one). The client sends
it back as X-Sandbox-Pod-IP, which the router ignores; without it the client would read the Sandbox again before
every request."""
_UIDS = uuid.UUID("5d0c1c0e-4a8f-4d0e-9a59-6f1c8f1b7a21")


def version_at(moment: float) -> int:
    """The even resource version of `moment`: an object made then; odd ones are its next state."""
    return 2 * int(moment * 1_000_000)


def now_version() -> str:
    """A version after every object that exists now: what a list answers as its own."""
    return str(version_at(time.time()) + 1)


def timestamp(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sandbox_uid(sandbox_id: str) -> str:
    """A stable uid for the claim of a sandbox: the same from every router, before and after a restart."""
    return str(uuid.uuid5(_UIDS, sandbox_id))


def namespace_of(info: SandboxInfo) -> str:
    """Sandboxes claimed through rollbox's own API are in the namespace `default`."""
    return info.labels.get(CLAIM_NAMESPACE_LABEL, DEFAULT_NAMESPACE)


def user_labels(labels: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in labels.items() if not key.startswith(RESERVED_LABEL_PREFIX)}


@dataclass
class Claim:
    """A SandboxClaim: bound to a rollbox sandbox (`info`), or failed before it got one (`failure`)."""

    name: str
    namespace: str
    created: float
    uid: str
    labels: dict[str, str]
    spec: dict[str, Any]
    info: SandboxInfo | None = None
    failure: tuple[str, str] | None = None
    """(reason, message) of a claim that will never be ready, such as WarmPoolNotFound."""
    annotations: dict[str, str] = field(default_factory=dict)
    pod_ip: str = DEFAULT_POD_IP

    @classmethod
    def of(cls, info: SandboxInfo) -> Claim:
        spec: dict[str, Any] = {"warmPoolRef": {"name": info.warmpool or ""}}
        if info.expires_at is not None:
            spec["lifecycle"] = {"shutdownTime": timestamp(info.expires_at), "shutdownPolicy": "Delete"}
        return cls(info.labels.get(CLAIM_NAME_LABEL, info.id), namespace_of(info), info.created_at,
                   sandbox_uid(info.id), user_labels(info.labels), spec, info=info)

    @property
    def created_version(self) -> int:
        return version_at(self.created)

    @property
    def version(self) -> int:
        """The current state's version: the binding (or the failure) came right after the creation."""
        return self.created_version + 1

    def as_created(self) -> dict[str, Any]:
        """What the create call answers: the object before the controller set any status."""
        return self._object(self.created_version, status=None)

    def as_now(self, deleted_at: float | None = None) -> dict[str, Any]:
        obj = self._object(self.version if deleted_at is None else version_at(deleted_at) + 1, self._status())
        if deleted_at is not None:
            obj["metadata"]["deletionTimestamp"] = timestamp(deleted_at)
        return obj

    def _object(self, version: int, status: dict[str, Any] | None) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "apiVersion": CLAIM_API, "kind": "SandboxClaim",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                         "resourceVersion": str(version), "generation": 1,
                         "creationTimestamp": timestamp(self.created), "labels": dict(self.labels),
                         "annotations": dict(self.annotations)},
            "spec": self.spec,
        }
        if status is not None:
            obj["status"] = status
        return obj

    def _status(self) -> dict[str, Any]:
        if self.failure is not None:
            reason, message = self.failure
            return {"conditions": [_condition(False, reason, message, self.created)]}
        assert self.info is not None
        return {"conditions": [ready_condition(self.info)],
                "sandbox": {"name": self.info.id, "podIPs": [self.pod_ip]}}


def ready_condition(info: SandboxInfo) -> dict[str, Any]:
    if info.state == "stopped":
        return _condition(False, "SandboxNotReady", "the sandbox's container stopped: reset it with rollbox's SDK "
                          "or delete the claim", info.created_at)
    return _condition(True, "SandboxReady", "", info.created_at)


def _condition(ready: bool, reason: str, message: str, since: float) -> dict[str, Any]:
    return {"type": "Ready", "status": "True" if ready else "False", "reason": reason, "message": message,
            "lastTransitionTime": timestamp(since), "observedGeneration": 1}


def sandbox_object(info: SandboxInfo, pod_ip: str = DEFAULT_POD_IP) -> dict[str, Any]:
    """The Sandbox a claim is bound to; its name is the rollbox sandbox id, which the router's X-Sandbox-ID names."""
    return {
        "apiVersion": SANDBOX_API, "kind": "Sandbox",
        "metadata": {"name": info.id, "namespace": namespace_of(info), "uid": sandbox_uid("sandbox/" + info.id),
                     "resourceVersion": str(version_at(info.created_at) + 1), "generation": 1,
                     "creationTimestamp": timestamp(info.created_at),
                     "labels": user_labels(info.labels)},
        "spec": {"replicas": 1},
        "status": {"conditions": [ready_condition(info)], "podIPs": [pod_ip], "replicas": 1},
    }


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `Status` object, the shape every Kubernetes API error (and a watch's ERROR event) carries."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body
