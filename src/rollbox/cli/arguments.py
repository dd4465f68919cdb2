"""What several commands parse alike: the router to reach, the data directory, KEY=VALUE pairs."""

from __future__ import annotations

import argparse
import os
from typing import Any, TypeAlias

from rollbox.client import SandboxClient
from rollbox.client._http import DEFAULT_URL

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The subcommands of `rollbox`, to which each module of this package adds its own."""


class UsageError(Exception):
    """A mistake on the command line that argparse cannot see."""


def remote_options() -> argparse.ArgumentParser:
    """The options of every command that talks to a router."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--url", default=os.environ.get("ROLLBOX_URL", DEFAULT_URL),
                         help="the router's address, http://HOST:PORT or unix:///PATH "
                              "(env ROLLBOX_URL; default %(default)s)")
    options.add_argument("--token", default=os.environ.get("ROLLBOX_TOKEN"), help="bearer token (env ROLLBOX_TOKEN)")
    return options


def data_dir_options() -> argparse.ArgumentParser:
    """The option of every command that runs an engine here. No default in the parser: reading the engine's
    would load the engine for every command."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--data-dir", help="templates, layers and state (default /var/lib/rollbox)")
    return options


def claim_options() -> argparse.ArgumentParser:
    """How a node (`serve`, `node`) ends the claims nothing else ends (docs/faults.md)."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--default-shutdown-after", metavar="SECONDS",
                         help="end a claim made with neither a lease nor a shutdown_after of its own after this long "
                              "(e.g. 600, 30m; 'none': never; default 1h)")
    return options


def claim_settings(args: argparse.Namespace) -> dict[str, Any]:
    """`claim_options` as the node's keyword arguments."""
    from rollbox.units import parse_seconds

    given = args.default_shutdown_after
    if given is None:
        return {}
    try:
        seconds = None if given.lower() in ("none", "0") else parse_seconds(given)
    except ValueError as error:
        raise UsageError(f"--default-shutdown-after {given!r}: {error}") from None
    return {"default_shutdown_after": seconds}


def client(args: argparse.Namespace) -> SandboxClient:
    return SandboxClient(args.url, args.token)


def pairs(items: list[str], form: str) -> dict[str, str]:
    return dict(pair(item, form, repr(item)) for item in items)


def pair(item: str, form: str, where: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UsageError(f"{where}: write it as {form}")
    return key, value
