"""`serve` runs the router and this machine's node; `down` deletes what a stopped one left running.

The only commands that load the server, node and engine, and only when they run.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from rollbox.cli.arguments import Commands, UsageError, claim_options, claim_settings, data_dir_options, pair, pairs
from rollbox.cli.cluster import secret_options, serve_cluster
from rollbox.cli.images import node_options, node_settings
from rollbox.cli.output import out
from rollbox.cli.tracing import start_tracing, tracing_options
from rollbox.errors import Conflict


def add_commands(commands: Commands) -> None:
    serve = commands.add_parser("serve", parents=[data_dir_options(), secret_options(), tracing_options(),
                                                  node_options(), claim_options()],
                                help="run the router and this machine's node")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (%(default)s)")
    serve.add_argument("--socket", type=Path, metavar="PATH",
                       help="listen on this unix socket (mode 0600: your user only) instead of --host and --port; "
                            "clients use --url unix://PATH")
    serve.add_argument("--token", action="append", default=[], metavar="TENANT=TOKEN",
                       help="accept TOKEN as TENANT (repeatable); with none the server is open, on loopback only")
    serve.add_argument("--tokens-file", type=Path, metavar="FILE",
                       help="TENANT=TOKEN lines ('#' comments): tokens kept out of the process list")
    serve.add_argument("--admin", action="append", default=[], metavar="TENANT",
                       help="let TENANT apply and delete templates and warm pools (repeatable; open server: anyone)")
    serve.add_argument("--max-sandboxes", type=int, help="sandboxes this node runs at most")
    serve.add_argument("--delete-on-exit", action="store_true",
                       help="when stopped, delete every sandbox instead of leaving them to the next start")
    ports = serve.add_argument_group("ports into sandboxes (docs/ports.md)")
    ports.add_argument("--sandbox-domain", action="append", default=[], metavar="DOMAIN",
                       help="serve {port}-{sandbox id}.DOMAIN (a wildcard DNS name pointing here) as that sandbox's "
                            "port, besides *.localhost (repeatable; the first is what E2B's get_host gives)")
    ports.add_argument("--in-cluster-connections", action="store_true",
                       help="serve agent-sandbox's in-cluster connections: each sandbox's pod IP, a loopback address, "
                            "opens it WITHOUT a token to every process on this machine (docs/compat-agent-sandbox.md)")
    cluster = serve.add_argument_group("a cluster's router, instead of this machine's node (docs/cluster.md)")
    cluster.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                         help="join the Ray cluster at ADDRESS (default: the one this machine belongs to) and run a "
                              "node agent on every Ray node offering the resource 'rollbox'")
    cluster.add_argument("--node", action="append", default=[], metavar="URL",
                         help="route to the node agent at URL (repeatable; a host name resolving to several "
                              "addresses is one node per address)")
    cluster.add_argument("--release-idle-nodes", action="store_true",
                         help="with --ray: stop the node agents of empty nodes the warm pools and claims do not need, "
                              "so that Ray's autoscaler may remove those nodes")
    cluster.add_argument("--data-plane", choices=("auto", "nginx", "python"), default="auto",
                         help="who forwards commands and file calls to their nodes: nginx in front of the router, "
                              "or the router itself; auto: nginx when it is installed and tracing is off "
                              "(%(default)s)")
    cluster.add_argument("--node-data-dir", metavar="DIR",
                         help="with --ray: the node agents' data directory, where a node's label "
                              "rollbox.io/data-dir does not say; {node} stands for the node's name "
                              "(default /var/lib/rollbox)")
    serve.set_defaults(run=cmd_serve)

    down = commands.add_parser(
        "down", parents=[data_dir_options()], help="delete everything a stopped server left running",
        description="Deletes every sandbox, claim and snapshot of a data directory whose server is not running, "
                    "and every container, mount, cgroup and run directory of its engine. Templates and warm pools "
                    "stay.")
    down.set_defaults(run=cmd_down)


def cmd_serve(args: argparse.Namespace) -> None:
    start_tracing(args)
    tokens = {**pairs(args.token, "TENANT=TOKEN"), **_tokens_file(args.tokens_file)}
    if args.ray is not None or args.node:
        if args.ray is not None and args.node:
            raise UsageError("give --ray or --node, not both")
        serve_cluster(args, tokens, port_settings(args))
        return
    from rollbox.server import serve

    options = {} if args.max_sandboxes is None else {"max_sandboxes": args.max_sandboxes}
    if args.data_dir is not None:
        options["data_dir"] = args.data_dir
    serve(host=args.host, port=args.port, socket=args.socket, tokens=tokens, admins=args.admin,
          delete_on_exit=args.delete_on_exit, **options, **node_settings(args), **port_settings(args),
          **claim_settings(args))


def port_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ports options as `serve`'s and `serve_router`'s keyword arguments."""
    return {"sandbox_domains": (*args.sandbox_domain, "localhost"), "in_cluster": args.in_cluster_connections}


def _tokens_file(path: Path | None) -> dict[str, str]:
    """TENANT=TOKEN lines; a mistake is reported by line number, never by echoing what might be a token."""
    if path is None:
        return {}
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise UsageError(f"cannot read the tokens file {path}: {error.strerror}") from None
    tokens = {}
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            tenant, token = pair(line.strip(), "TENANT=TOKEN", f"{path}, line {number}")
            tokens[tenant.strip()] = token.strip()
    return tokens


def cmd_down(args: argparse.Namespace) -> None:
    from rollbox.engine import DEFAULT_DATA_DIR, Engine
    from rollbox.server.serve import delete_everything

    data_dir = Path(args.data_dir or DEFAULT_DATA_DIR).resolve()
    if not (data_dir / "state.db").is_file():
        raise UsageError(f"{data_dir} is not a rollbox data directory: give the --data-dir its server had")
    try:
        engine = Engine(data_dir)
    except Conflict:
        raise Conflict(f"a rollbox server runs on {data_dir}: stop it first (Ctrl-C or SIGTERM), or let it delete "
                       "its sandboxes as it stops (rollbox serve --delete-on-exit)") from None
    with contextlib.closing(engine):
        delete_everything(engine)
    out.print(f"deleted every sandbox and snapshot of {data_dir}; templates and warm pools stay")
