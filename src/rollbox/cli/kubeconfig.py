"""`rollbox kubeconfig`: a kubeconfig whose cluster is a rollbox router, for agent-sandbox's own client.

The client reads its Kubernetes API server and credentials from a kubeconfig; rollbox serves the part of that
API it uses (docs/compat-agent-sandbox.md). Each user of the kubeconfig is a rollbox tenant, its token the
tenant's token, so the claims one makes are invisible to another, as on the router's own API.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import yaml

from rollbox.cli.arguments import Commands, UsageError, pair

CLUSTER = "rollbox"


def add_command(commands: Commands, remote: argparse.ArgumentParser) -> None:
    kubeconfig = commands.add_parser(
        "kubeconfig", parents=[remote],
        help="write a kubeconfig for agent-sandbox's client, with rollbox as its cluster",
        description="Writes a kubeconfig whose cluster is the router at --url and whose user holds --token; "
                    "--user NAME=TOKEN adds a user and context per tenant.")
    kubeconfig.add_argument("--user", action="append", default=[], metavar="NAME=TOKEN",
                            help="another tenant: a user and a context named NAME (repeatable)")
    kubeconfig.add_argument("--namespace", default="default", help="the contexts' namespace (default %(default)s)")
    kubeconfig.add_argument("-o", "--output", help="write to this file (mode 0600) instead of standard output")
    kubeconfig.set_defaults(run=cmd_kubeconfig)


def cmd_kubeconfig(args: argparse.Namespace) -> None:
    users = [("rollbox", args.token)] if args.token or not args.user else []
    users += [pair(item, "NAME=TOKEN", f"--user {item!r}") for item in args.user]
    text = yaml.safe_dump(kubeconfig(args.url, users, args.namespace), sort_keys=False)
    if args.output is None:
        sys.stdout.write(text)
        return
    descriptor = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    print(f"wrote {args.output}: export KUBECONFIG={args.output} and connect the client with "
          f"SandboxDirectConnectionConfig(api_url={args.url!r}"
          + (", extra_headers={'Authorization': 'Bearer <token>'})" if users[0][1] else ")"), file=sys.stderr)


def kubeconfig(url: str, users: list[tuple[str, str | None]], namespace: str) -> dict[str, Any]:
    """The kubeconfig document: one cluster, a user and a context per tenant, the first one current."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--url {url}: a kubeconfig needs the router's http:// or https:// address "
                         "(Kubernetes clients do not speak to unix sockets); serve on a port")
    names = [name for name, _ in users]
    if len(set(names)) != len(names):
        raise UsageError("each user needs a name of its own")
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": CLUSTER, "cluster": {"server": url.rstrip("/")}}],
        "users": [{"name": name, "user": {"token": token} if token else {}} for name, token in users],
        "contexts": [{"name": name, "context": {"cluster": CLUSTER, "user": name, "namespace": namespace}}
                     for name in names],
        "current-context": names[0],
        "preferences": {},
    }
