"""agent-sandbox's own `SandboxTemplate` and `SandboxWarmPool` YAML (API group `extensions.agents.x-k8s.io`), read
as rollbox's: `rollbox apply -f` takes a manifest written for agent-sandbox.

What has a rollbox meaning maps: the runtime class (gVisor is `runsc`), the one container's resources, env,
working directory and user, its image (a registry image, pulled as docs/images.md says, or a base the node has:
`host`, `debian:<suite>`, an OCI layout or archive), and an egress network policy of IP blocks. What rollbox
cannot honour is refused with the field named, never dropped: a template that silently ran with less isolation,
or more network, than it says would be worse than one that does not apply. Fields that only concern a pod
(probes, ports, scheduling) and the container's command (the runtime server, whose API rollbox's exec agent
serves itself) are accepted and not used.
"""

from __future__ import annotations

from typing import Any

from rollbox.errors import InvalidResource

GROUP = "extensions.agents.x-k8s.io"
RUNTIME_CLASSES = {"gvisor": "runsc", "runsc": "runsc", "runc": "runc", "crun": "crun", "kata": "kata",
                   "kata-containers": "kata", "kata-qemu": "kata"}
BASES = ("host", "debian:", "oci:", "oci-archive:", "docker-archive:")
RESOURCES = {"cpu": "cpu", "memory": "memory", "ephemeral-storage": "disk"}
POD_ONLY = {"restartPolicy", "terminationGracePeriodSeconds", "dnsPolicy", "dnsConfig", "nodeSelector", "affinity",
            "tolerations", "priorityClassName", "schedulerName", "serviceAccountName", "automountServiceAccountToken",
            "enableServiceLinks", "topologySpreadConstraints", "hostname", "subdomain", "imagePullSecrets",
            "securityContext", "readinessGates", "overhead", "preemptionPolicy"}
CONTAINER_ONLY = {"name", "ports", "imagePullPolicy", "readinessProbe", "livenessProbe", "startupProbe", "command",
                  "args", "terminationMessagePath", "terminationMessagePolicy", "lifecycle", "stdin", "tty",
                  "resizePolicy"}
TEMPLATE_ONLY = {"networkPolicyManagement", "envVarsInjectionPolicy", "volumeClaimTemplatesPolicy"}


def to_rollbox(document: Any) -> Any:
    """The rollbox document for one of agent-sandbox's; any other document unchanged."""
    if not isinstance(document, dict) or str(document.get("apiVersion", "")).split("/")[0] != GROUP:
        return document
    kind, metadata = document.get("kind"), _mapping(document.get("metadata"), "metadata")
    name = metadata.get("name", "?")
    spec = _mapping(document.get("spec"), f"{kind} {name}: spec")
    if kind == "SandboxTemplate":
        rollbox_spec = _template(spec, f"{kind} {name}: spec")
    elif kind == "SandboxWarmPool":
        rollbox_spec = _warmpool(spec, f"{kind} {name}: spec")
    else:
        raise InvalidResource(f"kind: {kind!r}: rollbox applies agent-sandbox's SandboxTemplate and SandboxWarmPool "
                              "(claims are made by the client, through the router)")
    return {"apiVersion": "rollbox.dev/v1alpha1", "kind": kind,
            "metadata": {"name": name, "labels": metadata.get("labels") or {}}, "spec": rollbox_spec}


def _template(spec: dict[str, Any], where: str) -> dict[str, Any]:
    _refuse(spec, set(spec) - {"podTemplate", "networkPolicy", "volumeClaimTemplates", "service"} - TEMPLATE_ONLY,
            where, "not a field of agent-sandbox's SandboxTemplate")
    if spec.get("volumeClaimTemplates"):
        _refuse(spec, {"volumeClaimTemplates"}, where, "rollbox has no persistent volume claims: declare its named "
                "volumes on a rollbox template (docs/volumes.md)")
    if spec.get("service"):
        _refuse(spec, {"service"}, where, "a sandbox has no Service: its API is the router's")
    if spec.get("networkPolicyManagement", "Managed") != "Managed":
        _refuse(spec, {"networkPolicyManagement"}, where, "rollbox always enforces the template's network policy")
    pod = _mapping(_mapping(spec.get("podTemplate"), f"{where}.podTemplate").get("spec"), f"{where}.podTemplate.spec")
    template = _pod(pod, f"{where}.podTemplate.spec")
    template["network"] = _network(spec.get("networkPolicy"), f"{where}.networkPolicy")
    return template


def _pod(pod: dict[str, Any], where: str) -> dict[str, Any]:
    _refuse(pod, set(pod) - POD_ONLY - {"runtimeClassName", "containers"}, where,
            "rollbox has no equivalent (a sandbox is one container with the node's rootfs layers)")
    template: dict[str, Any] = {}
    if _mapping(pod.get("securityContext"), f"{where}.securityContext").get("runAsUser") is not None:
        template["user"] = str(pod["securityContext"]["runAsUser"])  # the container's own, below, wins
    runtime_class = pod.get("runtimeClassName")
    if runtime_class is not None:
        if runtime_class not in RUNTIME_CLASSES:
            raise InvalidResource(f"{where}.runtimeClassName: {runtime_class!r} is not a runtime rollbox runs: use "
                                  "gvisor (runsc), runc, crun or kata")
        template["runtime"] = RUNTIME_CLASSES[runtime_class]
    containers = pod.get("containers")
    if not isinstance(containers, list) or len(containers) != 1:
        raise InvalidResource(f"{where}.containers: a sandbox runs exactly one container, not "
                              f"{len(containers) if isinstance(containers, list) else 'none'}")
    template.update(_container(_mapping(containers[0], f"{where}.containers[0]"), f"{where}.containers[0]"))
    return template


def _container(container: dict[str, Any], where: str) -> dict[str, Any]:
    _refuse(container, set(container) - CONTAINER_ONLY - {"image", "env", "resources", "workingDir",
                                                          "securityContext"},
            where, "rollbox has no equivalent (mounts are rollbox volumes; envFrom has no ConfigMaps here)")
    template: dict[str, Any] = {"base": _base(container.get("image"), f"{where}.image")}
    env = {}
    for index, item in enumerate(container.get("env") or []):
        if not isinstance(item, dict) or "valueFrom" in item or not isinstance(item.get("name"), str):
            raise InvalidResource(f"{where}.env[{index}]: give name and value (valueFrom reads Secrets and "
                                  "ConfigMaps, which rollbox does not have)")
        env[item["name"]] = str(item.get("value", ""))
    if env:
        template["env"] = env
    if container.get("workingDir"):
        template["workdir"] = container["workingDir"]
    limits = _limits(_mapping(container.get("resources"), f"{where}.resources"), f"{where}.resources")
    if limits:
        template["limits"] = limits
    security = _mapping(container.get("securityContext"), f"{where}.securityContext")
    if security.get("privileged") or security.get("allowPrivilegeEscalation"):
        raise InvalidResource(f"{where}.securityContext: privileged containers and privilege escalation are never "
                              "allowed in a sandbox")
    if (security.get("capabilities") or {}).get("add"):
        raise InvalidResource(f"{where}.securityContext.capabilities.add: a sandbox keeps no capabilities")
    if security.get("runAsUser") is not None:
        template["user"] = str(security["runAsUser"])
    return template


def _base(image: Any, where: str) -> str:
    """The container's image as a template's base: a base the node has, or a registry image."""
    if not isinstance(image, str) or not image.strip():
        raise InvalidResource(f"{where}: give the container's image: a registry image (HOST/REPO:TAG), or a base "
                              "the node has: host, debian:<suite>, oci:<layout dir>[:tag], oci-archive:<file> or "
                              "docker-archive:<file>")
    return image if image.startswith((*BASES, "docker://")) else f"docker://{image}"


def _limits(resources: dict[str, Any], where: str) -> dict[str, Any]:
    """The container's limits, else its requests: a sandbox gets one amount of each resource."""
    _refuse(resources, set(resources) - {"limits", "requests", "claims"}, where, "not a field of resources")
    if resources.get("claims"):
        _refuse(resources, {"claims"}, where, "rollbox has no dynamic resource claims")
    amounts = {**_mapping(resources.get("requests"), f"{where}.requests"),
               **_mapping(resources.get("limits"), f"{where}.limits")}
    unknown = sorted(set(amounts) - set(RESOURCES))
    if unknown:
        raise InvalidResource(f"{where}: {unknown[0]!r}: rollbox limits cpu, memory and ephemeral-storage only "
                              "(no devices or extended resources)")
    return {RESOURCES[key]: value for key, value in amounts.items()}


def _network(policy: Any, where: str) -> dict[str, Any]:
    """Egress to IP blocks (with ports) maps to rollbox's allowlist; no policy, or no egress rule, is no network."""
    policy = _mapping(policy, where)
    _refuse(policy, set(policy) - {"ingress", "egress"}, where, "not a field of a sandbox's network policy")
    if policy.get("ingress"):
        raise InvalidResource(f"{where}.ingress: a sandbox takes no inbound connections: its API is the router's")
    egress = []
    for index, rule in enumerate(policy.get("egress") or []):
        rule = _mapping(rule, f"{where}.egress[{index}]")
        ports = [_port(port, f"{where}.egress[{index}].ports[{n}]") for n, port in enumerate(rule.get("ports") or [])]
        protocols = {protocol for _, protocol in ports}
        if len(protocols) > 1:
            raise InvalidResource(f"{where}.egress[{index}].ports: one protocol per rule: split TCP and UDP")
        destinations = rule.get("to") or []
        if not destinations:
            raise InvalidResource(f"{where}.egress[{index}].to: name the destinations (ipBlock.cidr): rollbox "
                                  "allows no egress to everywhere")
        for n, peer in enumerate(destinations):
            block = _mapping(peer, f"{where}.egress[{index}].to[{n}]")
            if set(block) != {"ipBlock"} or set(block["ipBlock"] or {}) != {"cidr"}:
                raise InvalidResource(f"{where}.egress[{index}].to[{n}]: only ipBlock.cidr maps (no pod or "
                                      "namespace selectors, no except): a sandbox sees no pods")
            destination: dict[str, Any] = {"cidr": block["ipBlock"]["cidr"]}
            if ports:
                destination.update(ports=[number for number, _ in ports], protocol=next(iter(protocols)))
            egress.append(destination)
    return {"mode": "allowlist", "egress": egress} if egress else {"mode": "none"}


def _port(port: Any, where: str) -> tuple[int, str]:
    port = _mapping(port, where)
    number = port.get("port")
    if not isinstance(number, int) or port.get("endPort") is not None:
        raise InvalidResource(f"{where}.port: a port number (no names, no endPort ranges)")
    protocol = str(port.get("protocol", "TCP")).lower()
    if protocol not in ("tcp", "udp"):
        raise InvalidResource(f"{where}.protocol: {port.get('protocol')!r}: TCP or UDP")
    return number, protocol


def _warmpool(spec: dict[str, Any], where: str) -> dict[str, Any]:
    _refuse(spec, set(spec) - {"replicas", "sandboxTemplateRef", "updateStrategy"}, where,
            "not a field of agent-sandbox's SandboxWarmPool")
    reference = _mapping(spec.get("sandboxTemplateRef"), f"{where}.sandboxTemplateRef")
    return {"replicas": spec.get("replicas", 1), "sandboxTemplateRef": {"name": reference.get("name")}}


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidResource(f"{where}: must be a mapping")
    return value


def _refuse(fields: dict[str, Any], names: set[str], where: str, why: str) -> None:
    if names:
        raise InvalidResource(f"{where}.{sorted(names)[0]}: {why}")
