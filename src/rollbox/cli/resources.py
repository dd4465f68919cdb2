"""`apply`, `get` and `delete`: templates, warm pools, sandboxes and snapshots, through the SDK."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel

from rollbox import errors
from rollbox.cli.arguments import Commands, UsageError, client
from rollbox.cli.output import ApplyProgress, label, out, progress, show
from rollbox.client import SandboxClient
from rollbox.spec import API_VERSION

KINDS = {
    "template": "templates", "templates": "templates",
    "warmpool": "warmpools", "warmpools": "warmpools", "pool": "warmpools", "pools": "warmpools",
    "sandbox": "sandboxes", "sandboxes": "sandboxes",
    "snapshot": "snapshots", "snapshots": "snapshots",
    "volume": "volumes", "volumes": "volumes",
}
"""Every spelling `get` and `delete` accept, and the kind each one means."""
SINGULAR = {"templates": "template", "warmpools": "warmpool", "sandboxes": "sandbox", "snapshots": "snapshot",
            "volumes": "volume"}


def add_commands(commands: Commands, remote: argparse.ArgumentParser) -> None:
    apply = commands.add_parser("apply", parents=[remote], help="create or update templates and warm pools")
    apply.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                       help="YAML file with one or more resources ('-' reads stdin; repeatable)")
    apply.add_argument("--wait", action="store_true", help="then wait until every warm pool applied is full")
    apply.set_defaults(run=cmd_apply)

    build = commands.add_parser("build", parents=[remote], help="build a template from a Dockerfile",
                                description="Builds the template NAME from a Dockerfile and its build context, which "
                                            "is sent to the server (less what .dockerignore leaves out).")
    build.add_argument("context", metavar="DIR", help="the build context")
    build.add_argument("-f", "--file", metavar="DOCKERFILE", help="the Dockerfile (DIR/Dockerfile by default)")
    build.add_argument("-t", "--tag", required=True, metavar="NAME", help="the template's name")
    build.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE", help="a build arg (repeatable)")
    build.add_argument("--target", metavar="STAGE", help="the stage to build (the last by default)")
    build.set_defaults(run=cmd_build)

    get = commands.add_parser("get", parents=[remote],
                              help="list templates, warmpools, sandboxes, snapshots or volumes")
    get.add_argument("kind", metavar="KIND", help="templates, warmpools, sandboxes, snapshots or volumes")
    get.add_argument("name", nargs="?", metavar="NAME", help="show only this one")
    get.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    get.set_defaults(run=cmd_get)

    delete = commands.add_parser("delete", parents=[remote],
                                 help="delete templates, warmpools, sandboxes, snapshots or volumes")
    delete.add_argument("kind", metavar="KIND", help="template, warmpool, sandbox, snapshot or volume")
    delete.add_argument("names", nargs="+", metavar="NAME")
    delete.set_defaults(run=cmd_delete)


def cmd_apply(args: argparse.Namespace) -> None:
    sdk = client(args)
    for filename in args.filename:
        source = sys.stdin.read() + "\n" if filename == "-" else Path(filename)
        with ApplyProgress() as bars:
            applied = sdk.apply(source, on_progress=bars.update)
        for event in applied:
            out.print(f"{label(event)} {event.status}")
        if args.wait:
            _fill(sdk, [event.name for event in applied if event.kind == "SandboxWarmPool" and event.name])


def cmd_build(args: argparse.Namespace) -> None:
    build_args = dict(item.partition("=")[::2] for item in args.build_arg)
    if any(not key for key in build_args):
        raise UsageError("--build-arg takes KEY=VALUE")
    spec = {"dockerfile": args.file or str(Path(args.context) / "Dockerfile"), "context": args.context,
            "buildArgs": build_args, **({"target": args.target} if args.target else {})}
    document = {"apiVersion": API_VERSION, "kind": "SandboxTemplate", "metadata": {"name": args.tag}, "spec": spec}
    with ApplyProgress() as bars:
        applied = client(args).apply(yaml.safe_dump(document), on_progress=bars.update)
    for event in applied:
        out.print(f"{label(event)} {event.status}")


def _fill(sdk: SandboxClient, pools: list[str]) -> None:
    """Waits until each pool has all its replicas ready, with a bar per pool."""
    with progress() as bars:
        tasks = {name: bars.add_task("", total=None, resource=f"warmpool/{name}") for name in pools}
        waiting = sorted(pools)
        while True:
            for name in list(waiting):
                pool = sdk.get_warmpool(name)
                bars.update(tasks[name], total=pool.replicas, completed=pool.ready,
                            description=f"{pool.ready}/{pool.replicas} ready")
                if pool.ready >= pool.replicas:
                    waiting.remove(name)
                    out.print(f"warmpool/{name} full")
            if not waiting:
                return
            time.sleep(0.2)


def _kind(name: str) -> str:
    try:
        return KINDS[name.lower()]
    except KeyError:
        raise UsageError(f"{name!r} is not a kind: use templates, warmpools, sandboxes, snapshots or volumes") from None


def cmd_get(args: argparse.Namespace) -> None:
    sdk = client(args)
    kind = _kind(args.kind)
    show(kind, _one(sdk, kind, args.name) if args.name else _all(sdk, kind), args.output)


def _all(sdk: SandboxClient, kind: str) -> list[BaseModel]:
    listing: dict[str, Callable[[], Sequence[BaseModel]]] = {
        "templates": sdk.list_templates,
        "warmpools": sdk.list_warmpools,
        "sandboxes": lambda: [sandbox.info for sandbox in sdk.list_sandboxes()],
        "snapshots": sdk.list_snapshots,
        "volumes": sdk.list_volumes,
    }
    return list(listing[kind]())


def _one(sdk: SandboxClient, kind: str, name: str) -> list[BaseModel]:
    if kind == "templates":
        return [sdk.get_template(name)]
    if kind == "warmpools":
        return [sdk.get_warmpool(name)]
    if kind == "sandboxes":
        return [sdk.get_sandbox(name).info]
    if kind == "volumes":
        return [sdk.get_volume(name)]
    found = [snapshot for snapshot in sdk.list_snapshots() if snapshot.name == name]
    if not found:
        raise errors.SnapshotNotFound(f"snapshot {name!r} does not exist: `rollbox get snapshots` lists them")
    return list(found)


def cmd_delete(args: argparse.Namespace) -> None:
    sdk = client(args)
    kind = _kind(args.kind)
    delete: Callable[[str], None] = {
        "templates": sdk.delete_template,
        "warmpools": sdk.delete_warmpool,
        "sandboxes": sdk.delete_sandbox,
        "snapshots": sdk.delete_snapshot,
        "volumes": sdk.delete_volume,
    }[kind]
    for name in args.names:
        delete(name)
        out.print(f"{SINGULAR[kind]}/{name} deleted")
