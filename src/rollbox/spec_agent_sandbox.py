"""agent-sandbox's own `SandboxTemplate` and `SandboxWarmPool` YAML (API group `extensions.agents.x-k8s.io`), and the
Kubernetes `NetworkPolicy` documents beside them, read as rollbox's: `rollbox apply -f` takes a manifest written for
agent-sandbox.

What has a rollbox meaning maps: the runtime class (gVisor is `runsc`), the one container's image (a registry image,
or a base the node has), resources, env, working directory and user, and egress to IP blocks, from the template's own
`networkPolicy` or from the NetworkPolicies in the same file that select its pods. What rollbox cannot honour is
refused with the field named and what to do instead, never dropped: a template that silently ran with less isolation,
or more network, than it says would be worse than one that does not apply. Every refusal of a file is reported at
once (`Refusals`). Fields that only concern a pod (probes, ports, scheduling) and the container's command (the runtime
server, whose API rollbox's exec agent serves itself) are accepted and not used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from rollbox.errors import InvalidResource
from rollbox.spec_network_policy import Policy, network_policies, template_network

GROUP = "extensions.agents.x-k8s.io"
RUNTIME_CLASSES = {"gvisor": "runsc", "runsc": "runsc", "runc": "runc", "crun": "crun", "kata": "kata",
                   "kata-containers": "kata", "kata-qemu": "kata"}
BASES = ("host", "debian:", "oci:", "oci-archive:", "docker-archive:", "docker://")
RESOURCES = {"cpu": "cpu", "memory": "memory", "ephemeral-storage": "disk"}
POD_ONLY = {"restartPolicy", "terminationGracePeriodSeconds", "dnsPolicy", "dnsConfig", "nodeSelector", "affinity",
            "tolerations", "priorityClassName", "schedulerName", "serviceAccountName", "automountServiceAccountToken",
            "enableServiceLinks", "topologySpreadConstraints", "hostname", "subdomain", "imagePullSecrets",
            "securityContext", "readinessGates", "overhead", "preemptionPolicy"}
CONTAINER_ONLY = {"name", "ports", "imagePullPolicy", "readinessProbe", "livenessProbe", "startupProbe", "command",
                  "args", "terminationMessagePath", "terminationMessagePolicy", "lifecycle", "stdin", "tty",
                  "resizePolicy"}
TEMPLATE_ONLY = {"networkPolicyManagement", "envVarsInjectionPolicy", "volumeClaimTemplatesPolicy"}
T = TypeVar("T")


class Refusals:
    """Every refusal found in a file, so that one `rollbox apply` tells them all."""

    def __init__(self) -> None:
        self.found: list[str] = []

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Records what the block refused, and goes on with the rest of the file."""
        try:
            yield
        except InvalidResource as error:
            self.found.extend(str(error).splitlines())

    def check(self) -> None:
        if len(self.found) == 1:
            raise InvalidResource(self.found[0])
        if self.found:
            raise InvalidResource(f"{len(self.found)} refusals, each with what to do:\n"
                                  + "\n".join(f"- {refusal}" for refusal in self.found))


def to_rollbox(document: Any, policies: list[Policy] | None = None, refusals: Refusals | None = None) -> Any:
    """The rollbox document for one of agent-sandbox's (`policies`: the file's NetworkPolicies); any other document
    unchanged. Refusals go to `refusals` when given (the caller raises them all), else raise at once."""
    if not isinstance(document, dict) or str(document.get("apiVersion", "")).split("/")[0] != GROUP:
        return document
    own = refusals or Refusals()
    kind, metadata = document.get("kind"), _mapping(document.get("metadata"), "metadata")
    name = metadata.get("name", "?")
    spec = _mapping(document.get("spec"), f"{kind} {name}: spec")
    if kind == "SandboxTemplate":
        rollbox_spec = _template(spec, f"{kind} {name}: spec", policies or [], own)
    elif kind == "SandboxWarmPool":
        rollbox_spec = _warmpool(spec, f"{kind} {name}: spec", own)
    else:
        raise InvalidResource(f"kind: {kind!r}: rollbox applies agent-sandbox's SandboxTemplate and SandboxWarmPool "
                              "(claims are made by the client, through the router)")
    if refusals is None:
        own.check()
    return {"apiVersion": "rollbox.dev/v1alpha1", "kind": kind,
            "metadata": {"name": name, "labels": metadata.get("labels") or {}}, "spec": rollbox_spec}


def _template(spec: dict[str, Any], where: str, policies: list[Policy], refusals: Refusals) -> dict[str, Any]:
    _refuse(spec, set(spec) - {"podTemplate", "networkPolicy", "volumeClaimTemplates", "service"} - TEMPLATE_ONLY,
            where, "not a field of agent-sandbox's SandboxTemplate", refusals)
    if spec.get("volumeClaimTemplates"):
        _refuse(spec, {"volumeClaimTemplates"}, where, "rollbox has no persistent volume claims: declare its named "
                "volumes on a rollbox template (docs/volumes.md)", refusals)
    if spec.get("service"):
        _refuse(spec, {"service"}, where, "a sandbox has no Service: its ports are reached through the router "
                "(docs/ports.md); leave it out", refusals)
    pod_template = _mapping(spec.get("podTemplate"), f"{where}.podTemplate")
    pod = _mapping(pod_template.get("spec"), f"{where}.podTemplate.spec")
    template = _pod(pod, f"{where}.podTemplate.spec", refusals)
    labels = _mapping(pod_template.get("metadata"), f"{where}.podTemplate.metadata").get("labels") or {}
    with refusals.collecting():
        template["network"] = template_network(spec, labels, policies, where)
    return template


def _pod(pod: dict[str, Any], where: str, refusals: Refusals) -> dict[str, Any]:
    _refuse(pod, set(pod) - POD_ONLY - {"runtimeClassName", "containers"}, where,
            "rollbox has no equivalent (a sandbox is one container with the node's rootfs layers): leave it out",
            refusals)
    template: dict[str, Any] = {}
    with refusals.collecting():
        if _mapping(pod.get("securityContext"), f"{where}.securityContext").get("runAsUser") is not None:
            template["user"] = str(pod["securityContext"]["runAsUser"])  # the container's own, below, wins
    runtime_class = pod.get("runtimeClassName")
    if runtime_class is not None and runtime_class not in RUNTIME_CLASSES:
        refusals.found.append(f"{where}.runtimeClassName: {runtime_class!r} is not a runtime rollbox runs: use "
                              "gvisor (runsc), runc, crun or kata")
    elif runtime_class is not None:
        template["runtime"] = RUNTIME_CLASSES[runtime_class]
    containers = pod.get("containers")
    if not isinstance(containers, list) or len(containers) != 1:
        refusals.found.append(f"{where}.containers: a sandbox runs exactly one container, not "
                              f"{len(containers) if isinstance(containers, list) else 'none'}: keep one")
        return template
    with refusals.collecting():
        template.update(_container(_mapping(containers[0], f"{where}.containers[0]"), f"{where}.containers[0]",
                                   refusals))
    return template


def _container(container: dict[str, Any], where: str, refusals: Refusals) -> dict[str, Any]:
    _refuse(container, set(container) - CONTAINER_ONLY - {"image", "env", "resources", "workingDir",
                                                          "securityContext"},
            where, "rollbox has no equivalent (mounts are rollbox volumes; envFrom has no ConfigMaps here): leave it "
                   "out", refusals)
    template: dict[str, Any] = {}
    with refusals.collecting():
        template["base"] = _base(container.get("image"), f"{where}.image")
    env = {}
    for index, item in enumerate(container.get("env") or []):
        if not isinstance(item, dict) or "valueFrom" in item or not isinstance(item.get("name"), str):
            refusals.found.append(f"{where}.env[{index}]: give name and value (valueFrom reads Secrets and "
                                  "ConfigMaps, which rollbox does not have)")
            continue
        env[item["name"]] = str(item.get("value", ""))
    if env:
        template["env"] = env
    if container.get("workingDir"):
        template["workdir"] = container["workingDir"]
    with refusals.collecting():
        limits = _limits(_mapping(container.get("resources"), f"{where}.resources"), f"{where}.resources", refusals)
        if limits:
            template["limits"] = limits
    with refusals.collecting():
        template.update(_security(_mapping(container.get("securityContext"), f"{where}.securityContext"),
                                  f"{where}.securityContext"))
    return template


def _security(security: dict[str, Any], where: str) -> dict[str, Any]:
    if security.get("privileged") or security.get("allowPrivilegeEscalation"):
        raise InvalidResource(f"{where}: privileged containers and privilege escalation are never allowed in a "
                              "sandbox: leave them out")
    if (security.get("capabilities") or {}).get("add"):
        raise InvalidResource(f"{where}.capabilities.add: a sandbox keeps no capabilities: leave it out")
    return {"user": str(security["runAsUser"])} if security.get("runAsUser") is not None else {}


def _base(image: Any, where: str) -> str:
    """The container's image as a template's base: a base the node has, or a registry image."""
    if not isinstance(image, str) or not image.strip():
        raise InvalidResource(f"{where}: give the container's image: a registry image (HOST/REPO:TAG), or a base "
                              "the node has: host, debian:<suite>, oci:<layout dir>[:tag], oci-archive:<file> or "
                              "docker-archive:<file>")
    return image if image.startswith((*BASES, "docker://")) else f"docker://{image}"


def _limits(resources: dict[str, Any], where: str, refusals: Refusals) -> dict[str, Any]:
    """The container's limits, else its requests: a sandbox gets one amount of each resource."""
    _refuse(resources, set(resources) - {"limits", "requests", "claims"}, where, "not a field of resources",
            refusals)
    if resources.get("claims"):
        _refuse(resources, {"claims"}, where, "rollbox has no dynamic resource claims: leave it out", refusals)
    amounts = {**_mapping(resources.get("requests"), f"{where}.requests"),
               **_mapping(resources.get("limits"), f"{where}.limits")}
    for unknown in sorted(set(amounts) - set(RESOURCES)):
        refusals.found.append(f"{where}: {unknown!r}: rollbox limits cpu, memory and ephemeral-storage only (no "
                              "devices or extended resources): leave it out")
    return {RESOURCES[key]: value for key, value in amounts.items() if key in RESOURCES}


def _warmpool(spec: dict[str, Any], where: str, refusals: Refusals) -> dict[str, Any]:
    _refuse(spec, set(spec) - {"replicas", "sandboxTemplateRef", "updateStrategy"}, where,
            "not a field of agent-sandbox's SandboxWarmPool", refusals)
    reference = _mapping(spec.get("sandboxTemplateRef"), f"{where}.sandboxTemplateRef")
    return {"replicas": spec.get("replicas", 1), "sandboxTemplateRef": {"name": reference.get("name")}}


class Refused(Exception):
    """A document whose refusals are noted already."""


def parse_all(documents: list[Any], parse: Callable[[Any, list[Policy], Refusals], T]) -> list[T]:
    """`parse` of every document of a file but its NetworkPolicies, which it is given; every refusal of the file is
    raised at once (a policy that selects no template's pods is one: it would protect nothing)."""
    refusals = Refusals()
    documents, policies = network_policies(documents, refusals.found)
    parsed = []
    for document in documents:
        try:
            parsed.append(parse(document, policies, refusals))
        except Refused:
            continue
        except InvalidResource as error:
            refusals.found.extend(str(error).splitlines())
    refusals.found.extend(f"NetworkPolicy {policy.name}: its podSelector selects no SandboxTemplate's pods in this "
                          "file: apply it with the templates it is for" for policy in policies if not policy.used)
    refusals.check()
    return parsed


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidResource(f"{where}: must be a mapping")
    return value


def _refuse(fields: dict[str, Any], names: set[str], where: str, why: str, refusals: Refusals) -> None:
    refusals.found.extend(f"{where}.{name}: {why}" for name in sorted(names))
