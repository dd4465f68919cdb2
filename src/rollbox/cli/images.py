"""`rollbox image pull|prefetch|ls|rm|prune` and `rollbox registry login|ls|logout` (docs/images.md)."""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from rollbox.cli.arguments import Commands, UsageError, client, pairs
from rollbox.cli.output import out, show
from rollbox.models import ImageInfo, PullEvent


def add_commands(commands: Commands, remote: argparse.ArgumentParser) -> None:
    image = commands.add_parser("image", help="pull, list and remove registry images")
    actions = image.add_subparsers(metavar="ACTION", required=True)
    pull = actions.add_parser("pull", parents=[remote], help="pull images, showing each layer's progress")
    pull.add_argument("images", nargs="+", metavar="IMAGE", help="HOST/REPO:TAG or HOST/REPO@sha256:...")
    pull.add_argument("--all-nodes", action="store_true", help="on a cluster, pull on every node")
    pull.set_defaults(run=cmd_pull)
    prefetch = actions.add_parser("prefetch", parents=[remote], help="start pulling images in the background")
    prefetch.add_argument("images", nargs="+", metavar="IMAGE")
    prefetch.set_defaults(run=cmd_prefetch)
    listing = actions.add_parser("ls", parents=[remote], help="list your images (shared layers counted once)")
    listing.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    listing.set_defaults(run=cmd_list)
    remove = actions.add_parser("rm", parents=[remote], help="remove images (by name or digest)")
    remove.add_argument("images", nargs="+", metavar="IMAGE")
    remove.set_defaults(run=cmd_remove)
    prune = actions.add_parser("prune", parents=[remote], help="remove every layer nothing holds (admins)")
    prune.set_defaults(run=cmd_prune)

    registry = commands.add_parser("registry", help="your credentials for private registries")
    actions = registry.add_subparsers(metavar="ACTION", required=True)
    login = actions.add_parser("login", parents=[remote], help="store credentials for a registry")
    login.add_argument("host", metavar="HOST")
    login.add_argument("-u", "--username", required=True)
    login.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    login.set_defaults(run=cmd_login)
    listing = actions.add_parser("ls", parents=[remote], help="list the registries you have credentials for")
    listing.set_defaults(run=cmd_registries)
    logout = actions.add_parser("logout", parents=[remote], help="forget your credentials for a registry")
    logout.add_argument("host", metavar="HOST")
    logout.set_defaults(run=cmd_logout)


def cmd_pull(args: argparse.Namespace) -> None:
    def progress(event: PullEvent) -> None:
        if event.event == "progress":
            out.print(f"{event.image}: {event.message}", markup=False, soft_wrap=True)

    for info in client(args).images.pull(*args.images, on_progress=progress, all_nodes=args.all_nodes):
        out.print(f"image/{info.names[0] if info.names else info.digest} pulled ({info.digest})", markup=False)


def cmd_prefetch(args: argparse.Namespace) -> None:
    client(args).images.prefetch(*args.images)
    out.print(f"prefetching {len(args.images)} image(s)")


def cmd_list(args: argparse.Namespace) -> None:
    images: list[ImageInfo] = list(client(args).images.list())
    show("images", images, args.output)
    if args.output == "table" and images:
        out.print(f"{len(images)} image(s), {_unique_bytes(images) / 1e6:.1f} MB on disk (shared layers once)")


def cmd_remove(args: argparse.Namespace) -> None:
    sdk = client(args)
    for image in args.images:
        sdk.images.remove(image)
        out.print(f"image/{image} removed", markup=False)


def cmd_prune(args: argparse.Namespace) -> None:
    freed = client(args).images.prune()["freed"]
    out.print(f"{freed / 1e6:.1f} MB freed")


def cmd_login(args: argparse.Namespace) -> None:
    password = sys.stdin.readline().rstrip("\n") if args.password_stdin else getpass.getpass("password: ")
    info = client(args).registries.login(args.host, args.username, password)
    out.print(f"registry/{info.host} credentials stored for {info.username}", markup=False)


def cmd_registries(args: argparse.Namespace) -> None:
    for info in client(args).registries.list():
        out.print(f"{info.host}\t{info.username}", markup=False)


def cmd_logout(args: argparse.Namespace) -> None:
    client(args).registries.logout(args.host)
    out.print(f"registry/{args.host} credentials removed", markup=False)


def _unique_bytes(images: list[ImageInfo]) -> int:
    """What the listed images take together: a layer they share counted once."""
    return sum({layer: size for image in images for layer, size in image.layer_bytes.items()}.values())


def node_options() -> argparse.ArgumentParser:
    """How a node (`serve`, `node`) reaches registries and keeps images."""
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("images (docs/images.md)")
    group.add_argument("--insecure-registry", action="append", default=[], metavar="HOST",
                       help="reach HOST (and only it) over plain HTTP or unverified TLS (repeatable)")
    group.add_argument("--registry-mirror", action="append", default=[], metavar="HOST=MIRROR",
                       help="try MIRROR before HOST for its images (repeatable)")
    group.add_argument("--registry-auth", type=Path, metavar="FILE",
                       help="a docker config.json whose credentials every pull may use (the operator's)")
    group.add_argument("--image-budget", metavar="SIZE", help="disk for image layers; the least recently used "
                                                              "that nothing holds go past it (e.g. 200Gi)")
    group.add_argument("--max-image-size", metavar="SIZE", default="64Gi",
                       help="the largest image (compressed) a pull takes (%(default)s)")
    group.add_argument("--claim-caps", metavar="cpu=N,memory=SIZE,...",
                       help="the most one claim's own limits may ask (default: the machine's cores, half its memory)")
    return options


def node_settings(args: argparse.Namespace) -> dict[str, Any]:
    """`node_options` as the engine's and node's keyword arguments."""
    from rollbox.engine.images.registry import RegistrySettings
    from rollbox.spec import Limits
    from rollbox.units import parse_bytes

    mirrors: dict[str, tuple[str, ...]] = {}
    for host, mirror in pairs(args.registry_mirror, "HOST=MIRROR").items():
        mirrors[host] = (*mirrors.get(host, ()), mirror)
    try:
        settings = {"registries": RegistrySettings(auth_file=args.registry_auth, mirrors=mirrors,
                                                   insecure=frozenset(args.insecure_registry),
                                                   max_image_bytes=parse_bytes(args.max_image_size)),
                    "image_budget": parse_bytes(args.image_budget) if args.image_budget else None}
        if args.claim_caps:
            settings["claim_caps"] = Limits(**dict(item.split("=", 1) for item in args.claim_caps.split(",")))
    except (ValueError, TypeError) as error:
        raise UsageError(f"image options: {error}") from None
    return settings
