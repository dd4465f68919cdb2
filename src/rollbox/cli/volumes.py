"""`rollbox volume create|ls|rm`: a tenant's named volumes (docs/volumes.md). `get volumes` and `delete volume`
work too, as for every kind."""

from __future__ import annotations

import argparse

from rollbox.cli.arguments import Commands, client
from rollbox.cli.output import out, show


def add_command(commands: Commands, remote: argparse.ArgumentParser) -> None:
    volume = commands.add_parser("volume", help="create, list and delete named volumes")
    actions = volume.add_subparsers(metavar="ACTION", required=True)

    create = actions.add_parser("create", parents=[remote], help="create a volume of a size (e.g. 1Gi)")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--size", required=True, help="its size limit: bytes, or with a unit (500Mi, 1Gi)")
    create.set_defaults(run=cmd_create)

    listing = actions.add_parser("ls", parents=[remote], help="list volumes: size, used, who mounts them")
    listing.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    listing.set_defaults(run=cmd_list)

    remove = actions.add_parser("rm", parents=[remote], help="delete volumes and their files (none may be mounted)")
    remove.add_argument("names", nargs="+", metavar="NAME")
    remove.set_defaults(run=cmd_remove)


def cmd_create(args: argparse.Namespace) -> None:
    volume = client(args).create_volume(args.name, args.size)
    out.print(f"volume/{volume.name} created")


def cmd_list(args: argparse.Namespace) -> None:
    show("volumes", list(client(args).list_volumes()), args.output)


def cmd_remove(args: argparse.Namespace) -> None:
    sdk = client(args)
    for name in args.names:
        sdk.delete_volume(name)
        out.print(f"volume/{name} deleted")
