"""agent-sandbox's own SandboxTemplate and SandboxWarmPool manifests, read by `rollbox apply` as rollbox resources:
what maps, maps; what rollbox cannot honour is refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from rollbox.errors import InvalidResource
from rollbox.spec import SandboxTemplate, SandboxWarmPool, load_resources
from tests.support.kuberay_demo import DEMO

MANIFEST = """\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: python-runtime-template
  namespace: default
spec:
  podTemplate:
    metadata:
      labels: {app: python-runtime}
    spec:
      runtimeClassName: gvisor
      restartPolicy: Always
      securityContext: {runAsUser: 1000}
      containers:
      - name: python-runtime
        image: oci-archive:/srv/images/python-runtime.tar
        command: ["uvicorn", "main:app", "--port", "8888"]
        ports: [{containerPort: 8888}]
        readinessProbe: {httpGet: {path: /, port: 8888}}
        workingDir: /app
        env:
        - {name: PYTHONUNBUFFERED, value: "1"}
        resources:
          requests: {cpu: 250m, memory: 256Mi}
          limits: {cpu: "2", memory: 1Gi, ephemeral-storage: 2Gi}
  networkPolicy:
    egress:
    - to: [{ipBlock: {cidr: 10.20.0.0/16}}]
      ports: [{port: 443, protocol: TCP}]
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: python-pool}
spec:
  replicas: 3
  sandboxTemplateRef: {name: python-runtime-template}
  updateStrategy: {type: Recreate}
"""


def documents() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(MANIFEST))


def test_what_maps_maps() -> None:
    template, pool = load_resources(MANIFEST)
    assert isinstance(template, SandboxTemplate) and isinstance(pool, SandboxWarmPool)
    spec = template.spec
    assert (template.metadata.name, spec.runtime, spec.base) == ("python-runtime-template", "runsc",
                                                                "oci-archive:/srv/images/python-runtime.tar")
    assert (spec.user, spec.workdir, spec.env) == ("1000", "/app", {"PYTHONUNBUFFERED": "1"})
    assert (spec.limits.cpu, spec.limits.memory, spec.limits.disk) == (2.0, 2**30, 2 * 2**30)
    assert spec.network.mode == "allowlist"
    assert [(e.cidr, e.ports, e.protocol) for e in spec.network.egress] == [("10.20.0.0/16", [443], "tcp")]
    assert (pool.metadata.name, pool.spec.replicas, pool.spec.sandbox_template_ref.name) == (
        "python-pool", 3, "python-runtime-template")


def test_a_registry_image_is_the_templates_base() -> None:
    template = documents()[0]
    template["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "registry.example:5000/python:3.12"
    (parsed,) = load_resources(yaml.safe_dump(template))
    assert parsed.spec.base == "docker://registry.example:5000/python:3.12"


def test_no_policy_and_runc_give_rollbox_defaults() -> None:
    template = documents()[0]
    del template["spec"]["networkPolicy"], template["spec"]["podTemplate"]["spec"]["runtimeClassName"]
    (parsed,) = load_resources(yaml.safe_dump(template))
    assert (parsed.spec.runtime, parsed.spec.network.mode) == ("runc", "none")


@pytest.mark.parametrize(("path", "value", "named"), [
    (["podTemplate", "spec", "containers", 0, "image"], "", "containers[0].image"),
    (["podTemplate", "spec", "runtimeClassName"], "nvidia", "runtimeClassName"),
    (["podTemplate", "spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"], 1, "nvidia.com/gpu"),
    (["podTemplate", "spec", "containers", 0, "env", 0], {"name": "K", "valueFrom": {}}, "env[0]"),
    (["podTemplate", "spec", "containers", 0, "volumeMounts"], [{"name": "v"}], "volumeMounts"),
    (["podTemplate", "spec", "containers", 0, "securityContext"], {"privileged": True}, "securityContext"),
    (["podTemplate", "spec", "volumes"], [{"name": "v"}], "podTemplate.spec.volumes"),
    (["podTemplate", "spec", "hostNetwork"], True, "hostNetwork"),
    (["networkPolicy", "ingress"], [{"from": []}], "networkPolicy.ingress"),
    (["networkPolicy", "egress", 0, "to", 0], {"podSelector": {}}, "egress[0].to[0]"),
    (["volumeClaimTemplates"], [{"metadata": {"name": "data"}}], "volumeClaimTemplates"),
    (["networkPolicyManagement"], "Unmanaged", "networkPolicyManagement"),
])
def test_what_does_not_map_names_the_field(path: list[Any], value: Any, named: str) -> None:
    template = documents()[0]
    where = template["spec"]
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    with pytest.raises(InvalidResource, match=named.replace(".", r"\.").replace("[", r"\[")):
        load_resources(yaml.safe_dump(template))


def test_two_containers_are_refused() -> None:
    template = documents()[0]
    containers = template["spec"]["podTemplate"]["spec"]["containers"]
    containers.append({**containers[0], "name": "sidecar"})
    with pytest.raises(InvalidResource, match="exactly one container"):
        load_resources(yaml.safe_dump(template))


def test_rollbox_documents_are_untouched() -> None:
    (template,) = load_resources("apiVersion: rollbox.dev/v1alpha1\nkind: SandboxTemplate\nmetadata: {name: t}\n")
    assert template.spec.base == "host"




def test_a_demo_manifest_with_its_network_policy_applies() -> None:
    template, pool = load_resources(DEMO)
    assert isinstance(template, SandboxTemplate) and isinstance(pool, SandboxWarmPool)
    assert (template.spec.runtime, template.spec.base) == (
        "runsc", "docker://registry.example.com/agent-sandbox/python-runtime-sandbox:v0.4.6")
    assert template.spec.network.mode == "none"  # DNS alone allows nothing: a sandbox resolves no names


def test_a_network_policy_of_ip_blocks_is_the_allowlist() -> None:
    dns = "cidr: 169.254.20.10/32}}]\n    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]"
    https = "cidr: 10.9.0.0/16}}]\n    ports: [{protocol: TCP, port: 443}, {protocol: UDP, port: 443}]"
    policy = DEMO.replace(dns, https)
    (template, _) = load_resources(policy)
    assert template.spec.network.mode == "allowlist"
    assert [(e.cidr, e.ports, e.protocol) for e in template.spec.network.egress] == [
        ("10.9.0.0/16", [443], "tcp"), ("10.9.0.0/16", [443], "udp")]


def test_every_refusal_of_a_file_is_told_at_once() -> None:
    broken = (DEMO.replace("runtimeClassName: gvisor", "runtimeClassName: nvidia")
              .replace("imagePullPolicy: Always", "imagePullPolicy: Always\n        volumeMounts: [{name: v}]")
              .replace("app: python-runtime-pool}\n  policyTypes", "app: elsewhere}\n  policyTypes"))
    with pytest.raises(InvalidResource) as refused:
        load_resources(broken)
    message = str(refused.value)
    for named in ("runtimeClassName", "volumeMounts", "networkPolicyManagement: Unmanaged",
                  "NetworkPolicy python-runtime-pool-restrict-egress: its podSelector selects no"):
        assert named in message, (named, message)
    assert message.startswith("4 refusals, each with what to do:")


def test_network_policies_refuse_what_an_allowlist_cannot_say() -> None:
    ingress = DEMO.replace("policyTypes: [Egress]", "policyTypes: [Egress, Ingress]")
    with pytest.raises(InvalidResource, match="policyTypes: Ingress"):
        load_resources(ingress)
    pods = DEMO.replace("ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]\n  - to: [{ipBlock",
                        "ports: [{protocol: TCP, port: 8080}]\n  - to: [{ipBlock", 1)
    with pytest.raises(InvalidResource, match=r"egress\[0\]\.to\[0\]: only ipBlock\.cidr maps"):
        load_resources(pods)
    managed = DEMO.replace("  networkPolicyManagement: Unmanaged\n", "")
    (template, _) = load_resources(managed)  # policies add up: the template's own (none) and the file's (DNS)
    assert template.spec.network.mode == "none"
