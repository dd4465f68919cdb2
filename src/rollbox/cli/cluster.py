"""`node` runs a node agent; `serve --ray` and `serve --node` run a cluster's router (docs/cluster.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rollbox.cli.arguments import Commands, UsageError, claim_options, claim_settings, data_dir_options
from rollbox.cli.images import node_options, node_settings
from rollbox.cli.tracing import start_tracing, tracing_options

SECRET_VARIABLE = "ROLLBOX_CLUSTER_SECRET"
NODE_PORT = 8090


def add_command(commands: Commands) -> None:
    node = commands.add_parser(
        "node", parents=[data_dir_options(), secret_options(), tracing_options(), node_options(), claim_options()],
        help="run a node agent for a cluster's routers",
        description="Runs this machine's engine and node behind rollbox's API for the routers of a cluster "
                    "(`rollbox serve --node URL` or `--ray`). Only callers holding the cluster secret may call it.")
    node.add_argument("--name", required=True, help="the node's name, unique in the cluster; it starts every sandbox "
                                                    "id this node gives out")
    node.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    node.add_argument("--port", type=int, default=NODE_PORT, help="port to listen on (%(default)s)")
    node.add_argument("--max-sandboxes", type=int, default=64, help="sandboxes this node runs at most (%(default)s)")
    node.set_defaults(run=cmd_node)


def secret_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--secret-file", type=Path, metavar="FILE",
                         help=f"the cluster secret routers and node agents share (else ${SECRET_VARIABLE})")
    return options


def secret(args: argparse.Namespace) -> str:
    if args.secret_file is not None:
        try:
            return args.secret_file.read_text().strip()
        except OSError as error:
            raise UsageError(f"cannot read the secret file {args.secret_file}: {error.strerror}") from None
    value = os.environ.get(SECRET_VARIABLE, "").strip()
    if not value:
        raise UsageError(f"give the cluster secret: --secret-file FILE, or ${SECRET_VARIABLE} "
                         "(make one with `openssl rand -hex 32`)")
    return value


def cmd_node(args: argparse.Namespace) -> None:
    from rollbox._signals import exit_on_sigterm
    from rollbox.cluster.agent import NodeAgent
    from rollbox.engine import DEFAULT_DATA_DIR
    from rollbox.server.listen import listen_tcp

    start_tracing(args)
    agent = NodeAgent(args.data_dir or DEFAULT_DATA_DIR, args.name, secret(args), max_sandboxes=args.max_sandboxes,
                      **node_settings(args), **claim_settings(args))
    exit_on_sigterm()
    with listen_tcp(args.host, args.port) as listener:
        agent.run(listener)


def serve_cluster(args: argparse.Namespace, tokens: dict[str, str], ports: dict[str, Any]) -> None:
    """The router of `rollbox serve --ray [ADDRESS]` or `--node URL ...`; `ports`: `serve_router`'s ports options."""
    from rollbox.cluster.serve import serve_router

    capacity = args.max_sandboxes or 64
    if args.ray is not None:
        try:
            from rollbox.cluster.on_ray import RayMembers
        except ImportError:
            raise UsageError("--ray needs Ray: pip install 'rollbox[ray]'") from None
        from rollbox.engine import DEFAULT_DATA_DIR

        members = RayMembers(None if args.ray == "auto" else args.ray, secret(args),
                             data_dir=args.node_data_dir or str(DEFAULT_DATA_DIR), node_capacity=capacity)
    else:
        if args.release_idle_nodes:
            raise UsageError("--release-idle-nodes needs --ray: without Ray there is no autoscaler to give nodes to")
        from rollbox.cluster.static import StaticMembers

        members = StaticMembers(args.node)
    serve_router(members, secret(args), host=args.host, port=args.port, tokens=tokens, admins=args.admin,
                 node_capacity=capacity, release_idle=args.release_idle_nodes, data_plane=args.data_plane,
                 **ports)
