"""`ps`, `logs` and `kill`: a sandbox's background processes (docs/processes.md), through the SDK. `rollbox exec
--background` starts one."""

from __future__ import annotations

import argparse
import sys

from rollbox.cli.arguments import Commands, client
from rollbox.cli.output import show
from rollbox.cli.sandboxes import exit_status


def add_commands(commands: Commands, remote: argparse.ArgumentParser) -> None:
    ps = commands.add_parser("ps", parents=[remote], help="list a sandbox's background processes")
    ps.add_argument("sandbox", metavar="SANDBOX", help="the sandbox's id")
    ps.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    ps.set_defaults(run=cmd_ps)

    logs = commands.add_parser(
        "logs", parents=[remote], help="print a background process's output and follow it",
        description="Prints the output a background process has written (what the sandbox keeps of it), follows it "
                    "until the process ends (Ctrl-C stops following, the process runs on), and exits with its exit "
                    "code.")
    logs.add_argument("sandbox", metavar="SANDBOX", help="the sandbox's id")
    logs.add_argument("process", metavar="PROCESS", help="the process's id (`rollbox ps` lists them)")
    logs.set_defaults(run=cmd_logs)

    kill = commands.add_parser("kill", parents=[remote], help="send a signal to a background process")
    kill.add_argument("sandbox", metavar="SANDBOX", help="the sandbox's id")
    kill.add_argument("process", metavar="PROCESS", help="the process's id")
    kill.add_argument("-s", "--signal", default="SIGTERM", help="a name or a number (default: %(default)s)")
    kill.set_defaults(run=cmd_kill)


def cmd_ps(args: argparse.Namespace) -> None:
    show("processes", client(args).get_sandbox(args.sandbox).commands.list(), args.output)


def cmd_logs(args: argparse.Namespace) -> int:
    handle = client(args).get_sandbox(args.sandbox).commands.connect(args.process)
    streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    for event in handle.events(0):
        if event.type in streams and event.data:
            streams[event.type].write(event.data)
            streams[event.type].flush()
        elif event.type == "end" and event.result is not None:
            return exit_status(event.result)
    return 0


def cmd_kill(args: argparse.Namespace) -> None:
    signal: int | str = int(args.signal) if args.signal.isdigit() else args.signal
    client(args).get_sandbox(args.sandbox).commands.kill(args.process, signal)
