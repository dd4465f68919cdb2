"""`fusion`: the SandboxFusion gateway (rollbox.rl.fusion) on its own, in front of a router.

It runs code for clients that send no token, so on TCP it answers only under a secret first path segment:
`http://127.0.0.1:8081/<key>`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rollbox.cli.arguments import Commands

KEY_ENV = "ROLLBOX_FUSION_KEY"
"""The gateway's key (see rollbox.server.capability), kept across restarts so that trainers' URLs stay."""


def add_command(commands: Commands, remote: argparse.ArgumentParser) -> None:
    fusion = commands.add_parser(
        "fusion", parents=[remote], help="serve SandboxFusion's API over the router's sandboxes",
        description="Serves SandboxFusion's POST /run_code and GET /v1/ping over rollbox sandboxes until stopped, "
                    "then deletes the sandboxes it claimed.")
    fusion.add_argument("--template", default="rl-python", help="the template of its sandboxes (%(default)s)")
    fusion.add_argument("--warmpool", default="rl-python", help="the warm pool it claims from (%(default)s)")
    fusion.add_argument("--isolation", choices=("isolated", "fresh"), default="isolated",
                        help="isolated: each request a throw-away copy of a shared sandbox; fresh: a sandbox each")
    fusion.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    fusion.add_argument("--port", type=int, default=8081, help="port to listen on (%(default)s)")
    fusion.add_argument("--key", default=os.environ.get(KEY_ENV),
                        help=f"the secret first path segment of the endpoint (env {KEY_ENV}); on TCP a random one "
                             "when not given, printed at start")
    fusion.add_argument("--socket", type=Path, metavar="PATH",
                        help="listen on this unix socket (mode 0600: your user only) instead of --host and --port")
    fusion.set_defaults(run=cmd_fusion)


def cmd_fusion(args: argparse.Namespace) -> None:
    from rollbox.client import AsyncSandboxClient
    from rollbox.rl.fusion import serve_fusion

    serve_fusion(AsyncSandboxClient(args.url, args.token), template=args.template, warmpool=args.warmpool,
                 isolation=args.isolation, host=args.host, port=args.port, key=args.key, socket=args.socket)
