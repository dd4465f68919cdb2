"""The `rollbox` command: run the router, apply resources, look at them, drive sandboxes.

A module per group of commands. Everything but `serve`, `node`, `down` and `demo` stands on the SDK alone, so what works
here works in a trainer; those three load the server, node and engine, and `fusion` the RL layer's gateway, only
when they run. Errors print one line and exit non-zero; tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rollbox import errors
from rollbox.cli import bench, cluster, demo, fusion, images, kubeconfig, processes, resources, sandboxes, serve, view
from rollbox.cli.arguments import UsageError, remote_options
from rollbox.cli.output import err
from rollbox.cli.volumes import add_command as add_volume_command


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = args.run(args)
    except (errors.RollboxError, UsageError, OSError) as error:
        err.print(f"rollbox: {error}", markup=False, soft_wrap=True)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code or 0)


def parser() -> argparse.ArgumentParser:
    rollbox = argparse.ArgumentParser(prog="rollbox", description="Isolated, stateful sandboxes for RL of code agents.")
    commands = rollbox.add_subparsers(metavar="COMMAND", required=True)
    remote = remote_options()
    serve.add_commands(commands)
    cluster.add_command(commands)
    resources.add_commands(commands, remote)
    sandboxes.add_commands(commands, remote)
    processes.add_commands(commands, remote)
    add_volume_command(commands, remote)
    images.add_commands(commands, remote)
    fusion.add_command(commands, remote)
    bench.add_command(commands, remote)
    kubeconfig.add_command(commands, remote)
    demo.add_command(commands)
    view.add_command(commands)
    return rollbox
