"""`view`: browse a run's trajectories (from `rollbox-train` or `collect`) in a web page served on loopback.

The page is the dashboard's trajectory viewer; the run stays on this machine and the server reads no other
file. It answers only to the token in the link it prints, so other users of the machine cannot read the run.
"""

from __future__ import annotations

import argparse
import secrets
import webbrowser
from pathlib import Path

from rollbox.cli.arguments import Commands, UsageError
from rollbox.cli.output import out

RUN_FILE = "trajectories.jsonl"


def add_command(commands: Commands) -> None:
    view = commands.add_parser(
        "view", help="browse a run's trajectories in a web page on this machine",
        description="Serves the trajectory viewer over one trajectories.jsonl on 127.0.0.1 until stopped (Ctrl-C): "
                    "episodes by task and reward, the reward curve, and each episode as a timeline: its actions, "
                    "exit codes, times, observations and model calls, then its tests, failed ones first.")
    view.add_argument("path", type=Path, metavar="RUN",
                      help=f"a {RUN_FILE}, or the directory that holds one (rollbox-train's output directory)")
    view.add_argument("--port", type=int, default=0, help="loopback port to listen on (default: a free one)")
    view.add_argument("--no-browser", action="store_true", help="print the link only; do not open a browser")
    view.set_defaults(run=cmd_view)


def run_file(path: Path) -> Path:
    """The trajectories file `path` names: itself, or the RUN_FILE in the directory it names."""
    found = path / RUN_FILE if path.is_dir() else path
    if not found.is_file():
        where = f"{path} holds no {RUN_FILE}" if path.is_dir() else f"{path} is not a file"
        raise UsageError(f"{where}: give a {RUN_FILE} or the directory rollbox-train wrote it to")
    return found.resolve()


def cmd_view(args: argparse.Namespace) -> None:
    from rollbox.server.dashboard.viewer_app import create_viewer_app
    from rollbox.server.listen import listen_tcp, server

    run = run_file(args.path)
    token = secrets.token_urlsafe(24)
    listener = listen_tcp("127.0.0.1", args.port)
    link = f"http://127.0.0.1:{listener.getsockname()[1]}/viewer#token={token}"
    out.print(f"viewing {run} at {link}  (Ctrl-C to stop)", markup=False, soft_wrap=True)
    if not args.no_browser:
        webbrowser.open(link)
    try:
        server(create_viewer_app(run, token), "warning").run(sockets=[listener])
    finally:
        listener.close()
