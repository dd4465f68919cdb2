"""What a Harbor task's environment becomes on rollbox: a template built from its Dockerfile, named by what it is
built from (so the tasks that share an environment share one build), with the network its policy asks for and the
user Docker would run it as.

Nothing here imports Harbor: these are plain rules, tested without the package.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dockerfile
import yaml

PUBLIC_EGRESS = "0.0.0.0/0"
"""Harbor's `public` network: every IPv4 destination. rollbox still never lets a sandbox reach its host or another
sandbox (docs/engine.md, Network)."""
LIMITS = {"memory": "2Gi", "disk": "10Gi", "pids": 4096, "output": "16Mi", "upload": "1Gi"}
"""What a task that names no resources gets (Harbor's own task defaults for memory and storage; room for an agent's
processes and threads), and room for an agent's command output and the logs Harbor downloads. A task's `cpus`,
`memory_mb` and `storage_mb` override the first ones per claim."""


def network(mode: str, allowed_hosts: Sequence[str] = (), nameservers: Sequence[str] = ()) -> dict[str, Any]:
    """The template's `network` for Harbor's `network_mode` (`no-network`, `public`, `allowlist`) and its hosts.

    Nameservers are reachable on port 53 in an allowlist; without one a sandbox resolves no names."""
    if mode == "no-network":
        return {"mode": "none"}
    if mode == "public":
        return {"mode": "allowlist", "egress": [PUBLIC_EGRESS]}
    if mode != "allowlist":
        raise ValueError(f"unknown network mode {mode!r}: Harbor's are no-network, public and allowlist")
    egress: list[Any] = [*allowed_hosts, *({"cidr": server, "ports": [53]} for server in nameservers)]
    return {"mode": "allowlist", "egress": egress} if egress else {"mode": "none"}


def sets_user(text: str) -> bool:
    """Whether the Dockerfile's last stage, or a stage it is built on, names a `USER` (else Docker runs it as the
    base image's user, root for almost every image). A Dockerfile that does not parse names none: its build says
    what is wrong with it."""
    try:
        commands = dockerfile.parse_string(text)
    except dockerfile.GoParseError:
        return False
    stages: list[tuple[str | None, str, bool]] = []  # (name, FROM what, sets a user)
    for command in commands:
        if command.cmd == "FROM" and command.value:
            words = command.value
            name = words[2].lower() if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append((name, words[0].lower(), False))
        elif command.cmd == "USER" and stages:
            stages[-1] = (*stages[-1][:2], True)
    stage = len(stages) - 1
    while stage >= 0:
        _, base, user = stages[stage]
        if user:
            return True
        stage = _stage_named(stages[:stage], base)
    return False


def _stage_named(earlier: list[tuple[str | None, str, bool]], base: str) -> int:
    """Which of the earlier stages `base` names (by name or number), or -1 when it names an image."""
    for index in range(len(earlier) - 1, -1, -1):
        if earlier[index][0] == base:
            return index
    return int(base) if base.isdigit() and int(base) < len(earlier) else -1


def template_name(environment_id: str, spec: dict[str, Any]) -> str:
    """`harbor-` and a digest of the environment's content (Harbor's own hash of its files) and of the spec it is
    built with: the same environment under the same network, user and runtime is one template."""
    digest = hashlib.sha256(json.dumps([environment_id, spec], sort_keys=True).encode()).hexdigest()
    return f"harbor-{digest[:24]}"


def template_spec(network_spec: dict[str, Any], user: str | None, runtime: str) -> dict[str, Any]:
    """The spec beside the Dockerfile: runtime, network, output and transfer limits, and the user when Docker's
    default (root) must be said, since rollbox's own default is an unprivileged one."""
    spec: dict[str, Any] = {"runtime": runtime, "network": network_spec, "limits": dict(LIMITS)}
    if user is not None:
        spec["user"] = user
    return spec


def template_document(name: str, spec: dict[str, Any], dockerfile_path: Path, context: Path) -> str:
    """A SandboxTemplate built from the Dockerfile at `dockerfile_path` over the build context `context` (both
    absolute: the SDK packs the context where it runs and sends it with the Dockerfile)."""
    document = {"apiVersion": "rollbox.dev/v1alpha1", "kind": "SandboxTemplate", "metadata": {"name": name},
                "spec": {**spec, "dockerfile": str(dockerfile_path.resolve()), "context": str(context.resolve())}}
    return yaml.safe_dump(document, sort_keys=False)
