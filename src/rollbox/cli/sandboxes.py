"""`ls` and `exec`: the sandboxes a tenant holds, and commands in them, through the SDK."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from rollbox.cli.arguments import Commands, client, pairs
from rollbox.cli.output import err, out, show
from rollbox.models import ExecResult


def add_commands(commands: Commands, remote: argparse.ArgumentParser) -> None:
    ls = commands.add_parser("ls", parents=[remote], help="list sandboxes")
    ls.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    ls.set_defaults(run=cmd_ls)

    exec_ = commands.add_parser(
        "exec", parents=[remote], help="run a command in a sandbox",
        description="Runs a command in a sandbox, streaming its output, and exits with its exit code (124 on timeout). "
                    "One argument runs under /bin/sh -c; several are the argv.",
    )
    exec_.add_argument("sandbox", metavar="SANDBOX", help="the sandbox's id")
    exec_.add_argument("command", nargs="+", metavar="CMD", help="after --: the command and its arguments")
    exec_.add_argument("--timeout", type=float, help="seconds before the command is killed")
    exec_.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE")
    exec_.add_argument("-w", "--cwd", help="working directory inside the sandbox")
    exec_.add_argument("-u", "--user", help="user to run as (the template's by default)")
    exec_.add_argument("-i", "--stdin", action="store_true", help="send this command's stdin to the command")
    exec_.add_argument("-d", "--background", action="store_true",
                       help="start it as a background process, print its id and return (`rollbox logs` follows it)")
    exec_.set_defaults(run=cmd_exec)


def cmd_ls(args: argparse.Namespace) -> None:
    show("sandboxes", [sandbox.info for sandbox in client(args).list_sandboxes()], args.output)


def cmd_exec(args: argparse.Namespace) -> int:
    env = pairs(args.env, "KEY=VALUE") or None
    command: str | list[str] = args.command[0] if len(args.command) == 1 else args.command
    sandbox = client(args).get_sandbox(args.sandbox)
    if args.background:
        handle = sandbox.commands.run(command, background=True, timeout=args.timeout, env=env, cwd=args.cwd,
                                      user=args.user, stdin=sys.stdin.read() if args.stdin else None)
        out.print(handle.id, markup=False)
        return 0
    result = sandbox.commands.run(
        command, timeout=args.timeout, env=env, cwd=args.cwd, user=args.user,
        stdin=sys.stdin.read() if args.stdin else None, on_stdout=_writer(sys.stdout), on_stderr=_writer(sys.stderr),
    )
    return exit_status(result, args.timeout)


def exit_status(result: ExecResult, timeout: float | None = None) -> int:
    """What `rollbox` exits with for a command: its exit code, 124 if it timed out (said on stderr), or 128 + the
    signal that ended it."""
    if result.timed_out:
        after = f" after {timeout:g}s" if timeout else ""
        err.print(f"rollbox: the command timed out{after} and was killed", markup=False)
        return 124
    if result.exit_code is None:
        return 128 + result.signal
    return result.exit_code


def _writer(stream: Any) -> Callable[[str], None]:
    def write(data: str) -> None:
        stream.write(data)
        stream.flush()

    return write
