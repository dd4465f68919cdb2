"""The `rollbox` command loads the server, node and engine only for the commands that run them here."""

from __future__ import annotations

import subprocess
import sys

import pytest

LOAD = """\
import sys
from rollbox.cli import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    print(done.code, *sorted(m for m in sys.modules if m.startswith('rollbox')))
"""
"""Runs `rollbox ARGV` and prints its exit code and the rollbox modules it loaded on the last line."""
CLIENT_COMMANDS = [
    ["--help"], ["ls", "--help"], ["get", "--help"], ["exec", "--help"], ["apply", "--help"], ["fusion", "--help"],
    ["ps", "--help"], ["logs", "--help"], ["kill", "--help"],
    ["ls", "--url", "unix:///nonexistent/router.sock"],  # runs, and fails reaching the router: one line, exit 1
]


@pytest.mark.parametrize("argv", CLIENT_COMMANDS, ids=" ".join)
def test_client_commands_stand_on_the_sdk_alone(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", LOAD, *argv], capture_output=True, text=True, check=True)
    exit_code, *loaded = done.stdout.splitlines()[-1].split()
    assert exit_code == ("0" if "--help" in argv else "1"), done.stderr
    assert "rollbox.client" in loaded
    assert [m for m in loaded if m.startswith(("rollbox.engine", "rollbox.node", "rollbox.server", "rollbox.rl"))] == []
