"""deploy/k8s, checked without a cluster: every document against the Kubernetes API's schemas, and what ties the
documents to each other and to the `rollbox` command.

A built-in kind is read into the kubernetes client's model of it, strictly: a field its API does not have (or
spelt as the client's Python attribute), a missing required field or a value of the wrong type fails. The
RayCluster is checked against KubeRay's CRD schema (tests/unit/data says which version), its metadata and pod
templates by the same models. Then what a cluster would only show once it runs: selectors that select the pods
they mean, ports and Secret keys that exist, node agents that only the routers reach, container commands that
`rollbox`'s own parser accepts, pointing at the files, directories, ports and Service they need.
`test_each_check_can_fail` breaks a copy of the manifests in one place and sees the check for it fail.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes.client
import pydantic
import pytest
import yaml

from rollbox.cli import parser as rollbox_parser
from rollbox.engine import DEFAULT_DATA_DIR

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUSTOMIZATION = "kustomization.yaml"
RAYCLUSTER_SCHEMA = Path(__file__).resolve().parent / "data" / "kuberay-raycluster-v1.schema.yaml"
MODEL_KEYWORD = "x-rollbox-kubernetes-model"
"""In the RayCluster schema: the kubernetes client's model that checks this part."""
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")
RAY_TMP = "/tmp/ray"
"""Where Ray keeps the address and sockets a driver on the head's machine joins by."""

Doc = dict[str, Any]


class ManifestError(AssertionError):
    """A manifest a cluster would refuse, or that would not work once applied."""


@dataclass(frozen=True)
class Manifest:
    file: str
    doc: Doc

    @property
    def kind(self) -> str:
        return self.doc.get("kind", "")

    @property
    def name(self) -> str:
        return self.doc.get("metadata", {}).get("name", "")

    @property
    def namespace(self) -> str | None:
        return self.doc.get("metadata", {}).get("namespace")

    def __str__(self) -> str:
        return f"{self.file}: {self.kind}/{self.name}"


@dataclass
class Deploy:
    manifests: list[Manifest]
    kustomization: Doc

    def find(self, kind: str, name: str) -> Doc:
        return next(m.doc for m in self.manifests if (m.kind, m.name) == (kind, name))

    def secret_keys(self, namespace: str | None, name: str) -> set[str] | None:
        """The keys of a Secret, None if there is no such Secret."""
        for m in self.manifests:
            if (m.kind, m.name, m.namespace) == ("Secret", name, namespace):
                return {*m.doc.get("data", {}), *m.doc.get("stringData", {})}
        return None


@functools.cache
def load() -> Deploy:
    manifests = [Manifest(path.name, doc) for path in sorted(DEPLOY.glob("*.yaml")) if path.name != KUSTOMIZATION
                 for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return Deploy(manifests, yaml.safe_load((DEPLOY / KUSTOMIZATION).read_text()))


# -- the pods the manifests make -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pods:
    """The pods one workload (or one group of a RayCluster) makes."""

    owner: str
    namespace: str | None
    labels: dict[str, str]
    spec: Doc
    ray_cluster: str | None = None
    ray_group: str | None = None
    ray_start_params: dict[str, str] = field(default_factory=dict)

    def containers(self) -> list[Doc]:
        return self.spec.get("containers", [])

    def volume(self, name: str) -> Doc:
        for volume in self.spec.get("volumes", []):
            if volume["name"] == name:
                return volume
        raise ManifestError(f"{self.owner}: no volume {name!r}")

    def has_port(self, port: int | str) -> bool:
        """Whether a container of these pods declares the port, by number or by name."""
        return any(port in (declared["containerPort"], declared.get("name"))
                   for container in self.containers() for declared in container.get("ports", []))


def all_pods(deploy: Deploy) -> list[Pods]:
    pods = []
    for m in deploy.manifests:
        if m.kind in WORKLOADS:
            template = m.doc["spec"]["template"]
            pods.append(Pods(str(m), m.namespace, _labels(template), template["spec"]))
        elif m.kind == "RayCluster":
            workers = m.doc["spec"].get("workerGroupSpecs", [])
            groups = [("head", m.doc["spec"]["headGroupSpec"]), *((group["groupName"], group) for group in workers)]
            pods += [Pods(f"{m}, group {name}", m.namespace, _labels(group["template"]), group["template"]["spec"],
                          m.name, name, group.get("rayStartParams", {})) for name, group in groups]
    return pods


def _labels(template: Doc) -> dict[str, str]:
    return template.get("metadata", {}).get("labels", {})


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """A LabelSelector: matchLabels and matchExpressions; the empty one selects every pod."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for requirement in selector.get("matchExpressions", []):
        key, values = requirement["key"], requirement.get("values", [])
        present = key in labels
        if not {"In": present and labels.get(key) in values, "NotIn": labels.get(key) not in values,
                "Exists": present, "DoesNotExist": not present}[requirement["operator"]]:
            return False
    return True


def selected(deploy: Deploy, namespace: str | None, selector: Doc) -> list[Pods]:
    return [pods for pods in all_pods(deploy) if pods.namespace == namespace and selects(selector, pods.labels)]


# -- the rollbox commands the containers run -----------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    pods: Pods
    container: Doc
    argv: list[str]
    args: Any  # argparse.Namespace

    @property
    def subcommand(self) -> str:
        return self.argv[0]

    def __str__(self) -> str:
        return f"{self.pods.owner}, container {self.container['name']}: rollbox {' '.join(self.argv)}"


def rollbox_argv(container: Doc) -> list[str] | None:
    """The arguments of `rollbox` if the container runs it, as written."""
    line = [*container.get("command", []), *container.get("args", [])]
    return line[1:] if line[:1] == ["rollbox"] else None


def commands(deploy: Deploy) -> list[Command]:
    return [command for pods in all_pods(deploy) for command in commands_of(pods)]


def commands_of(pods: Pods) -> Iterator[Command]:
    """Every `rollbox ...` the pods run, their $(VARIABLE)s expanded as the kubelet does, parsed by rollbox."""
    for container in pods.containers():
        if (written := rollbox_argv(container)) is not None:
            argv = [_expand(word, container, pods.owner) for word in written]
            yield Command(pods, container, argv, _parse(argv, f"{pods.owner}: rollbox {' '.join(argv)}"))


def _expand(word: str, container: Doc, where: str) -> str:
    defined = {variable["name"] for variable in container.get("env", [])}

    def variable(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        if match[1] not in defined:  # the kubelet would pass "$(NAME)" on as it is
            raise ManifestError(f"{where}: {match[0]} names no environment variable of container {container['name']}")
        return f"<{match[1]}>"

    return re.sub(r"\$\$|\$\((\w+)\)", variable, word)


def _parse(argv: list[str], where: str) -> Any:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            return rollbox_parser().parse_args(argv)
    except SystemExit:
        raise ManifestError(f"{where}: rollbox refuses it: {errors.getvalue().strip().splitlines()[-1]}") from None


def role(pods: Pods) -> set[str]:
    """What the pods are to rollbox: 'router' (rollbox serve), 'node-agent' (rollbox node, or a Ray worker group
    offering rollbox's resource, where the router starts node agents)."""
    roles = {{"serve": "router", "node": "node-agent"}.get(argv[0], "")
             for container in pods.containers() if (argv := rollbox_argv(container))}
    if pods.ray_cluster and _ray_resources(pods).get(on_ray().RESOURCE):
        roles.add("node-agent")
    return roles - {""}


def _ray_resources(pods: Pods) -> dict[str, float]:
    """KubeRay writes rayStartParams.resources into a shell command as it is (`ray start --resources=...`): one
    shell word, which must be JSON once the shell has read it."""
    text = pods.ray_start_params.get("resources")
    if text is None:
        return {}
    try:
        (word,) = shlex.split(text)
        return json.loads(word)
    except ValueError as error:
        raise ManifestError(f"{pods.owner}: rayStartParams.resources {text!r} is not one shell word of JSON: "
                            f"{error}") from None


def on_ray() -> ModuleType:
    """rollbox's Ray side, for the names it gives Ray's resources and labels; it loads Ray, so only when needed."""
    import rollbox.cluster.on_ray

    return rollbox.cluster.on_ray


def mounted_secret_key(command: Command, path: str) -> tuple[str, str]:
    """The Secret and key whose content the container sees at `path`."""
    for mount in command.container.get("volumeMounts", []):
        secret = command.pods.volume(mount["name"]).get("secret")
        where = mount["mountPath"].rstrip("/")
        if secret is None or not (path == where if "subPath" in mount else path.startswith(where + "/")):
            continue
        relative = mount["subPath"] if "subPath" in mount else path[len(where) + 1:]
        items = secret.get("items")
        key = relative if items is None else next((item["key"] for item in items if item["path"] == relative), None)
        if key is None:
            raise ManifestError(f"{command}: {path} is in Secret {secret['secretName']}'s volume, but no item makes it")
        return secret["secretName"], key
    raise ManifestError(f"{command}: {path} is in no Secret the container mounts")


def host_directory_at(pods: Pods, container: Doc, path: str) -> bool:
    return any(mount["mountPath"].rstrip("/") == path.rstrip("/") and "hostPath" in pods.volume(mount["name"])
               for mount in container.get("volumeMounts", []))


# -- the checks ----------------------------------------------------------------------------------------------------


def check_schemas(deploy: Deploy) -> None:
    for m in deploy.manifests:
        if (m.doc.get("apiVersion"), m.kind) == ("ray.io/v1", "RayCluster"):
            check_raycluster(m)
        else:
            check_model(m.doc, builtin_model(m), str(m))


def builtin_model(m: Manifest) -> type[pydantic.BaseModel]:
    """The client's model of the kind, once the client's API for the apiVersion says it serves that kind."""
    group, _, version = m.doc.get("apiVersion", "").rpartition("/")
    api = "".join(part.title() for part in (group.removesuffix(".k8s.io") or "core").split(".")) + version.capitalize()
    operation = re.sub(r"(?<!^)(?=[A-Z])", "_", m.kind).lower()
    served = getattr(kubernetes.client, f"{api}Api", None)
    if served is None or not any(hasattr(served, f"create{scope}_{operation}") for scope in ("", "_namespaced")):
        raise ManifestError(f"{m}: the API {m.doc.get('apiVersion')!r} serves no kind {m.kind!r}")
    return getattr(kubernetes.client, version.capitalize() + m.kind)


def check_model(value: Any, model: type[pydantic.BaseModel], where: str) -> None:
    check_field_names(value, model.__name__, where)
    try:
        model.model_validate(value)
    except pydantic.ValidationError as error:
        raise ManifestError(f"{where}: not a valid {model.__name__}:\n{error}") from None


TYPE_ARGUMENT = re.compile(r"^(?:List\[(?P<item>.+)\]|Dict\[str, (?P<value>.+)\])$")


def check_field_names(value: Any, type_name: str, where: str) -> None:
    """Every field is one the model's API has, by its API name: the models also take their Python names
    (cluster_ip for clusterIP), which the API server refuses."""
    if argument := TYPE_ARGUMENT.match(type_name):
        if argument["item"] and isinstance(value, list):
            children: Any = enumerate(value)
        elif argument["value"] and isinstance(value, dict):
            children = value.items()
        else:
            return  # no list or map where one belongs: the model says so
        for key, child in children:
            check_field_names(child, argument["item"] or argument["value"], f"{where}[{key}]")
        return
    model = getattr(kubernetes.client, type_name, None)
    if not (isinstance(value, dict) and hasattr(model, "attribute_map")):
        return  # a value the model itself checks
    attributes = {api_name: attribute for attribute, api_name in model.attribute_map.items()}
    for key, child in value.items():
        if key not in attributes:
            raise ManifestError(f"{where}.{key}: {type_name} has no field {key!r}")
        check_field_names(child, model.openapi_types[attributes[key]], f"{where}.{key}")


def check_raycluster(m: Manifest) -> None:
    errors = sorted(_raycluster_validator().iter_errors(m.doc), key=lambda error: list(map(str, error.absolute_path)))
    if errors:
        raise ManifestError(f"{m}: not a valid RayCluster:\n" + "\n".join(
            f"  {'.'.join(map(str, error.absolute_path))}: {error.message}" for error in errors))


@functools.cache
def _raycluster_validator() -> jsonschema.protocols.Validator:
    validator = jsonschema.validators.extend(jsonschema.Draft7Validator, {MODEL_KEYWORD: _kubernetes_model})
    return validator(_strict(yaml.safe_load(RAYCLUSTER_SCHEMA.read_text())))


def _strict(schema: Any) -> Any:
    """Under strict field validation (kubectl's default) the API server refuses the fields a custom resource's
    schema does not name, rather than dropping them."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _strict(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema:
        strict["additionalProperties"] = False
    return strict


def _kubernetes_model(validator: Any, model: str, instance: Any, schema: Doc) -> Iterator[jsonschema.ValidationError]:
    try:
        check_model(instance, getattr(kubernetes.client, model), "")
    except ManifestError as error:
        yield jsonschema.ValidationError(str(error).removeprefix(": "))


def check_namespaces(deploy: Deploy) -> None:
    """Namespaced kinds name a namespace these manifests make; cluster-wide ones name none."""
    namespaces = {m.name for m in deploy.manifests if m.kind == "Namespace"}
    for m in deploy.manifests:
        cluster_wide = m.kind == "Namespace"
        if cluster_wide and m.namespace is not None:
            raise ManifestError(f"{m}: a {m.kind} belongs to no namespace")
        if not cluster_wide and m.namespace not in namespaces:
            raise ManifestError(f"{m}: namespace {m.namespace!r} is not one of these manifests' {sorted(namespaces)}")


def check_workload_selectors(deploy: Deploy) -> None:
    for m in deploy.manifests:
        if m.kind in WORKLOADS and not selects(m.doc["spec"]["selector"], _labels(m.doc["spec"]["template"])):
            raise ManifestError(f"{m}: spec.selector does not select the pods of its own template")


def check_services(deploy: Deploy) -> None:
    for m in deploy.manifests:
        if m.kind != "Service":
            continue
        selector = m.doc["spec"].get("selector")
        pods = selected(deploy, m.namespace, {"matchLabels": selector}) if selector else []
        if not pods:
            raise ManifestError(f"{m}: its selector {selector} selects no pods")
        for port in m.doc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if missing := [p.owner for p in pods if not p.has_port(target)]:
                raise ManifestError(f"{m}: port {port['port']} goes to {target!r}, which {missing} do not have")


def check_network_policies(deploy: Deploy) -> None:
    policies = [m for m in deploy.manifests if m.kind == "NetworkPolicy"]
    for m in policies:
        pods = selected(deploy, m.namespace, m.doc["spec"]["podSelector"])
        if not pods:
            raise ManifestError(f"{m}: spec.podSelector selects no pods")
        for rule in m.doc["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if "podSelector" in peer and not selected(deploy, m.namespace, peer["podSelector"]):
                    raise ManifestError(f"{m}: the peer {peer} selects no pods")
            for port in rule.get("ports", []):
                if missing := [p.owner for p in pods if "port" in port and not p.has_port(port["port"])]:
                    raise ManifestError(f"{m}: it opens port {port['port']!r}, which {missing} do not have")
    for pods in all_pods(deploy):
        ingress = [m for m in policies if m.namespace == pods.namespace
                   and "Ingress" in m.doc["spec"].get("policyTypes", ["Ingress"])
                   and selects(m.doc["spec"]["podSelector"], pods.labels)]
        if "node-agent" in role(pods):
            _check_only_routers_reach(deploy, pods, ingress)
        if "router" in role(pods) and not pods.ray_cluster:
            _check_router_port_only(pods, ingress)


def _check_only_routers_reach(deploy: Deploy, agents: Pods, policies: list[Manifest]) -> None:
    """A node agent obeys whoever holds the cluster secret: only routers may connect (and, on a Ray cluster, the
    pods of that cluster, which Ray needs)."""
    if not policies:
        raise ManifestError(f"{agents.owner}: runs node agents, and no NetworkPolicy limits who reaches them")
    routers_admitted = False
    for m in policies:
        for rule in m.doc["spec"].get("ingress", []):
            peers = rule.get("from", [])
            if not peers or any(set(peer) != {"podSelector"} for peer in peers):
                raise ManifestError(f"{m}: lets in more than pods of this namespace: {peers or 'anyone'}")
            for peer in peers:
                for pods in selected(deploy, m.namespace, peer["podSelector"]):
                    if not ("router" in role(pods) or (agents.ray_cluster and pods.ray_cluster == agents.ray_cluster)):
                        raise ManifestError(f"{m}: lets {pods.owner} reach the node agents of {agents.owner}")
                    routers_admitted |= "router" in role(pods)
    if not routers_admitted:
        raise ManifestError(f"{agents.owner}: no NetworkPolicy lets a router reach its node agents")


def _check_router_port_only(routers: Pods, policies: list[Manifest]) -> None:
    if not policies:
        raise ManifestError(f"{routers.owner}: no NetworkPolicy limits what reaches the router")
    listening = {command.args.port for command in commands_of(routers) if command.subcommand == "serve"}
    for m in policies:
        for rule in m.doc["spec"].get("ingress", []):
            ports = {port.get("port") for port in rule.get("ports", [])}
            if not ports or not ports <= listening | _port_names(routers, listening):
                raise ManifestError(f"{m}: lets in ports {sorted(ports, key=str) or 'all'}; the router listens on "
                                    f"{sorted(listening)}")


def _port_names(pods: Pods, numbers: set[int]) -> set[str]:
    return {port["name"] for container in pods.containers() for port in container.get("ports", [])
            if port["containerPort"] in numbers and "name" in port}


def check_secrets(deploy: Deploy) -> None:
    """Every Secret a pod mounts or reads a key of exists, with that key; every mount names a volume of the pod."""
    for pods in all_pods(deploy):
        for volume in pods.spec.get("volumes", []):
            if "secret" in volume:
                wanted = [item["key"] for item in volume["secret"].get("items", [])]
                _check_secret_keys(deploy, pods, volume["secret"]["secretName"], wanted)
        for container in pods.containers():
            for mount in container.get("volumeMounts", []):
                secret = pods.volume(mount["name"]).get("secret")
                if secret is not None and "subPath" in mount and "items" not in secret:
                    _check_secret_keys(deploy, pods, secret["secretName"], [mount["subPath"]])
            for variable in container.get("env", []):
                if reference := variable.get("valueFrom", {}).get("secretKeyRef"):
                    _check_secret_keys(deploy, pods, reference["name"], [reference["key"]])


def _check_secret_keys(deploy: Deploy, pods: Pods, name: str, keys: list[str]) -> None:
    existing = deploy.secret_keys(pods.namespace, name)
    if existing is None:
        raise ManifestError(f"{pods.owner}: uses Secret {name!r}, which these manifests do not make")
    if missing := sorted(set(keys) - existing):
        raise ManifestError(f"{pods.owner}: uses keys {missing} of Secret {name!r}, which has only {sorted(existing)}")


def check_commands(deploy: Deploy) -> None:
    """The options a `rollbox` container is given exist, and what they name is there: each file in a Secret that
    has it, the data directory on the host, the port declared, the node agents behind --node."""
    found = commands(deploy)
    if {command.subcommand for command in found} != {"serve", "node"}:
        raise ManifestError(f"expected containers running `rollbox serve` and `rollbox node`, found {found}")
    for command in found:
        for option in ("secret_file", "tokens_file"):
            if (path := getattr(command.args, option, None)) is not None:
                name, key = mounted_secret_key(command, str(path))
                _check_secret_keys(deploy, command.pods, name, [key])
        data_dir = str(command.args.data_dir or DEFAULT_DATA_DIR)
        if command.subcommand == "node" and not host_directory_at(command.pods, command.container, data_dir):
            raise ManifestError(f"{command}: its data directory {data_dir} is no host directory the container "
                                "mounts: a restarted agent would not find its sandboxes")
        if not command.pods.has_port(command.args.port):
            raise ManifestError(f"{command}: listens on {command.args.port}, a port the container does not declare")
        for url in getattr(command.args, "node", []):
            _check_node_url(deploy, command, url, found)
        if getattr(command.args, "ray", None) is not None:
            _check_joins_ray(command)


def _check_node_url(deploy: Deploy, router: Command, url: str, found: list[Command]) -> None:
    """--node names a headless Service in front of node agents: its name resolves to every agent's address."""
    parts = urlsplit(url)
    host, namespace = parts.hostname or "", router.pods.namespace
    services = [m for m in deploy.manifests if m.kind == "Service" and m.namespace == namespace
                and host in {m.name, f"{m.name}.{namespace}", f"{m.name}.{namespace}.svc",
                             f"{m.name}.{namespace}.svc.cluster.local"}]
    if not services:
        raise ManifestError(f"{router}: {url} names no Service of these manifests in namespace {namespace}")
    service = services[0].doc["spec"]
    if service.get("clusterIP") != "None":
        raise ManifestError(f"{router}: {url} is a Service with a cluster IP, one address: the router would see one "
                            "node (it takes a headless Service's addresses as one node each)")
    ports = [port for port in service["ports"] if port["port"] == parts.port]
    if not ports:
        raise ManifestError(f"{router}: {url}: the Service has no port {parts.port}")
    target = ports[0].get("targetPort", ports[0]["port"])
    for pods in selected(deploy, namespace, {"matchLabels": service["selector"]}):
        agents = [command for command in found if command.pods == pods and command.subcommand == "node"]
        if not agents:
            raise ManifestError(f"{router}: {url} reaches {pods.owner}, which runs no node agent")
        for agent in agents:
            if target not in (agent.args.port, *_port_names(pods, {agent.args.port})):
                raise ManifestError(f"{router}: {url} goes to port {target!r}; {agent} listens on {agent.args.port}")


def _check_joins_ray(router: Command) -> None:
    """A driver joins the Ray cluster of its machine through Ray's directory: it shares the Ray container's."""
    if router.pods.ray_group != "head":
        raise ManifestError(f"{router}: --ray runs on a Ray cluster's head, beside the Ray container")
    ray_container = router.pods.containers()[0]
    if not _volumes_at(ray_container, RAY_TMP) & _volumes_at(router.container, RAY_TMP):
        raise ManifestError(f"{router}: does not share {RAY_TMP} with the Ray container {ray_container['name']}")


def _volumes_at(container: Doc, path: str) -> set[str]:
    return {mount["name"] for mount in container.get("volumeMounts", []) if mount["mountPath"] == path}


def check_ray_workers(deploy: Deploy) -> None:
    """Each RayCluster has a worker group offering rollbox's resource, whose Ray nodes are named after their machine
    and keep the node agents' data directory on it."""
    name_label = on_ray().NAME_LABEL
    routers = {command.pods.ray_cluster: command for command in commands(deploy) if command.pods.ray_cluster}
    for m in (m for m in deploy.manifests if m.kind == "RayCluster"):
        workers = [pods for pods in all_pods(deploy) if pods.ray_cluster == m.name and "node-agent" in role(pods)]
        if not workers:
            raise ManifestError(f"{m}: no worker group offers the resource {on_ray().RESOURCE!r}: no node agent runs")
        router = routers.get(m.name)
        data_dir = (router and router.args.node_data_dir) or str(DEFAULT_DATA_DIR)
        for pods in workers:
            ray_container = pods.containers()[0]
            if f"--labels={name_label}=" not in " ".join(ray_container.get("args", [])):
                raise ManifestError(f"{pods.owner}: its Ray nodes carry no {name_label} label: a worker that comes "
                                    "back would be another node, and leave its sandboxes behind")
            if not host_directory_at(pods, ray_container, data_dir):
                raise ManifestError(f"{pods.owner}: the node agents' data directory {data_dir} is no host directory")


def check_kustomization(deploy: Deploy) -> None:
    """`kubectl apply -k` applies every file but those of a custom resource (which needs its operator installed
    first); it names files that exist, and the image the pods run."""
    listed = deploy.kustomization.get("resources", [])
    files = {m.file for m in deploy.manifests}
    custom = {m.file for m in deploy.manifests if m.kind == "RayCluster"}
    if len(set(listed)) != len(listed) or set(listed) != files - custom:
        raise ManifestError(f"{KUSTOMIZATION}: resources {listed}; the files to apply are {sorted(files - custom)}")
    images = {container["image"].rsplit(":", 1)[0] for pods in all_pods(deploy) for container in pods.containers()}
    renamed = {image["name"] for image in deploy.kustomization.get("images", [])}
    if renamed != images:
        raise ManifestError(f"{KUSTOMIZATION}: images {sorted(renamed)}; the pods run {sorted(images)}")


CHECKS: dict[str, Callable[[Deploy], None]] = {
    "schemas": check_schemas, "namespaces": check_namespaces, "workload selectors": check_workload_selectors,
    "services": check_services, "network policies": check_network_policies, "secrets": check_secrets,
    "commands": check_commands, "ray workers": check_ray_workers, "kustomization": check_kustomization,
}


@pytest.mark.parametrize("check", CHECKS)
def test_manifests(check: str) -> None:
    CHECKS[check](load())


# -- each check fails on a manifest broken for it ------------------------------------------------------------------


def _rename(mapping: Doc, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


def _router(deploy: Deploy) -> Doc:
    return deploy.find("Deployment", "rollbox-router")["spec"]["template"]["spec"]["containers"][0]


def _agent(deploy: Deploy) -> Doc:
    return deploy.find("DaemonSet", "rollbox-node-agent")["spec"]["template"]["spec"]["containers"][0]


def _raycluster(deploy: Deploy) -> Doc:
    return deploy.find("RayCluster", "rollbox")["spec"]


def _replace(words: list[str], old: str, new: str) -> None:
    words[words.index(old)] = new


BREAKS: dict[str, tuple[str, Callable[[Deploy], None], str]] = {
    "misspelt field": ("schemas", lambda d: _rename(_router(d), "readinessProbe", "readinesProbe"),
                       "no field 'readinesProbe'"),
    "python name": ("schemas", lambda d: _rename(d.find("Service", "rollbox-node")["spec"], "clusterIP", "cluster_ip"),
                    "no field 'cluster_ip'"),
    "wrong type": ("schemas", lambda d: d.find("Deployment", "rollbox-router")["spec"].update(replicas="2"),
                   "valid integer"),
    "missing field": ("schemas", lambda d: d.find("DaemonSet", "rollbox-node-agent")["spec"].pop("selector"),
                      "selector\n  Field required"),
    "kind of another api": ("schemas", lambda d: d.find("Service", "rollbox-router").update(apiVersion="apps/v1"),
                            "serves no kind 'Service'"),
    "raycluster misspelt field": ("schemas", lambda d: _rename(_raycluster(d)["workerGroupSpecs"][0], "groupName",
                                                               "groupname"), "'groupname' was unexpected"),
    "raycluster pod template": ("schemas", lambda d: _rename(_raycluster(d)["headGroupSpec"]["template"]["spec"],
                                                             "containers", "container"), "no field 'container'"),
    "foreign namespace": ("namespaces", lambda d: d.find("Secret", "rollbox-tokens")["metadata"].update(
        namespace="default"), "namespace 'default'"),
    "workload selector": ("workload selectors", lambda d: d.find("Deployment", "rollbox-router")["spec"]["selector"][
        "matchLabels"].update({"app.kubernetes.io/component": "routers"}), "does not select"),
    "service selector": ("services", lambda d: d.find("Service", "rollbox-router")["spec"]["selector"].update(
        {"app.kubernetes.io/component": "routers"}), "selects no pods"),
    "service target port": ("services", lambda d: d.find("Service", "rollbox-node")["spec"]["ports"][0].update(
        targetPort="nod"), "'nod'"),
    "policy selects nothing": ("network policies", lambda d: d.find("NetworkPolicy", "rollbox-node-agent-ingress")[
        "spec"]["podSelector"]["matchLabels"].update({"app.kubernetes.io/component": "node"}), "selects no pods"),
    "agents open to every pod": ("network policies", lambda d: d.find("NetworkPolicy", "rollbox-node-agent-ingress")[
        "spec"]["ingress"][0]["from"][0].update(podSelector={}), "reach the node agents"),
    "agents open to everyone": ("network policies", lambda d: d.find("NetworkPolicy", "rollbox-node-agent-ingress")[
        "spec"]["ingress"][0].pop("from"), "anyone"),
    "router port": ("network policies", lambda d: d.find("NetworkPolicy", "rollbox-router-ingress")["spec"][
        "ingress"][0]["ports"][0].update(port=8090), "8090"),
    "secret missing": ("secrets", lambda d: d.find("Deployment", "rollbox-router")["spec"]["template"]["spec"][
        "volumes"][0]["secret"].update(secretName="rollbox-token"), "'rollbox-token'"),
    "secret key missing": ("secrets", lambda d: _rename(d.find("Secret", "rollbox-tokens")["stringData"], "tokens",
                                                        "token"), r"keys \['tokens'\]"),
    "unknown option": ("commands", lambda d: _replace(_router(d)["command"], "--secret-file", "--secrets-file"),
                       "unrecognized arguments"),
    "file outside its secret": ("commands", lambda d: _replace(_agent(d)["command"], "/etc/rollbox/cluster/secret",
                                                               "/etc/rollbox/secret"), "in no Secret"),
    "node url": ("commands", lambda d: _replace(_router(d)["command"], "http://rollbox-node.rollbox.svc.cluster.local:8090",
                                                "http://rollbox-router.rollbox.svc.cluster.local:8080"), "cluster IP"),
    "undefined variable": ("commands", lambda d: _agent(d).pop("env"), r"\$\(NODE_NAME\) names no"),
    "data directory": ("commands", lambda d: _replace(_agent(d)["command"], "/var/lib/rollbox", "/var/lib/rollbox2"),
                       "no host directory"),
    "ray resource": ("ray workers", lambda d: _raycluster(d)["workerGroupSpecs"][0]["rayStartParams"].update(
        resources='"{\\"rollbx\\": 1}"'), "no worker group offers"),
    "ray node name": ("ray workers", lambda d: _raycluster(d)["workerGroupSpecs"][0]["template"]["spec"][
        "containers"][0]["args"].clear(), "no rollbox.io/node label"),
    "kustomization": ("kustomization", lambda d: d.kustomization["resources"].remove("router.yaml"), "router.yaml"),
}


@pytest.mark.parametrize("case", BREAKS)
def test_each_check_can_fail(case: str) -> None:
    check, breaking, expected = BREAKS[case]
    broken = copy.deepcopy(load())
    breaking(broken)
    with pytest.raises(ManifestError, match=expected):
        CHECKS[check](broken)


def test_every_check_has_a_case_that_breaks_it() -> None:
    assert {check for check, _, _ in BREAKS.values()} == set(CHECKS)
