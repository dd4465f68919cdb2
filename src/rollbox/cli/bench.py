"""`bench`: a thin hook to the server benchmark, which lives in the source checkout and reads ROLLBOX_URL like
any SDK user."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from rollbox.cli.arguments import Commands, UsageError

BENCH = Path(__file__).resolve().parents[3] / "bench" / "server.py"


def add_command(commands: Commands, remote: argparse.ArgumentParser) -> None:
    bench = commands.add_parser("bench", parents=[remote], help="benchmark a running server (bench/server.py)")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed on to bench/server.py")
    bench.set_defaults(run=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    if not BENCH.exists():
        raise UsageError(f"{BENCH} is not there: the server benchmark comes with the source checkout")
    env = {**os.environ, "ROLLBOX_URL": args.url}
    if args.token:
        env["ROLLBOX_TOKEN"] = args.token
    passed = args.args[1:] if args.args[:1] == ["--"] else args.args
    return subprocess.call([sys.executable, str(BENCH), *passed], env=env)
