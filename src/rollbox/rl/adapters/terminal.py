"""An interactive bash on a rollbox terminal, driven the way SWE-ReX drives its own with pexpect.

The shell is `bash -i` on a pseudo-terminal of the sandbox (a background process, docs/processes.md), so it
behaves as a person's shell does: Ctrl-C ends the whole command line that runs and the shell waits for
the next, and a program that reads the terminal (a REPL, a debugger) gets what is typed. Echo, prompts,
`\\r\\n` and history are turned off, so what the terminal sends is the commands' own output. Each command
is followed by a line that prints a marker with a fresh nonce and `$?`; the output is what comes before it.

Nothing lives between calls but the process's id and the offset read so far: every wait opens the
process's event stream from that offset, so a session survives its caller's event loop (SWE-agent runs
each call in an `asyncio.run` of its own).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import TYPE_CHECKING

from rollbox import errors

if TYPE_CHECKING:
    from rollbox.client import AsyncSandbox

SETUP = "stty -echo -onlcr noflsh; set +H +o history; unset HISTFILE PROMPT_COMMAND; PS1= PS2= PS0="
"""Run first: no echo of what is typed, `\\n` as written, type-ahead kept through Ctrl-C, no history."""
SHELL = ["bash", "--noprofile", "--norc", "--noediting", "-i"]
OUTPUT_LIMIT = 64 << 20
"""Bytes of output the sandbox keeps for the session until it is read (more is dropped: a `gap`)."""


class Ended(errors.RollboxError):
    """The terminal's shell exited (`exit`, or the sandbox went away)."""


class Terminal:
    """One interactive shell of a sandbox. One caller at a time, except `interrupt`, which may come while a
    `run` waits."""

    def __init__(self, sandbox: AsyncSandbox, process_id: str) -> None:
        self.sandbox = sandbox
        self.process_id = process_id
        self._offset = 0
        self._unread = ""
        self.pending: str | None = None
        """The nonce of a command whose marker has not come yet (it timed out, or it runs now)."""

    @classmethod
    async def open(cls, sandbox: AsyncSandbox, startup: list[str], timeout: float) -> tuple[Terminal, str]:
        """Starts the shell, runs the set-up and `startup`; returns the terminal and what the start-up printed."""
        handle = await sandbox.commands.run(SHELL, background=True, pty=True, output_limit=OUTPUT_LIMIT,
                                            env={"PS1": "", "PS2": "", "PS0": ""}, tag="swe-rex session")
        terminal = cls(sandbox, handle.id)
        await terminal.send(SETUP)
        output, _ = await terminal.command("\n".join(startup) if startup else ":", timeout)
        return terminal, output

    async def send(self, text: str) -> None:
        """Types `text` and Enter."""
        await self.sandbox.commands.send_stdin(self.process_id, text + "\n")

    async def command(self, command: str, timeout: float | None) -> tuple[str, int]:
        """Runs a command line with stdin from /dev/null; its output and exit code. Raises TimeoutError (the
        command goes on: `interrupt` ends it) and Ended."""
        nonce = secrets.token_hex(8)
        self.pending = nonce
        await self.send(f"{{\n{command}\n}} </dev/null")
        await self.send(f"printf '\\036{nonce}:%d\\036' $?")
        return await self.marker(nonce, timeout)

    async def marker(self, nonce: str, timeout: float | None) -> tuple[str, int]:
        """Waits for a command's marker: the output before it and the exit code in it."""
        match = await self.expect([f"\x1e{nonce}:(\\d+)\x1e"], timeout)
        self.pending = None
        return match.string[:match.start()], int(match.group(1))

    async def expect(self, patterns: list[str], timeout: float | None) -> re.Match[str]:
        """Reads until one of the regular expressions matches; what came before and the match are consumed."""
        compiled = [re.compile(pattern) for pattern in patterns]
        try:
            async with asyncio.timeout(timeout):
                match = self._search(compiled)
                while match is None:
                    match = await self._read_until(compiled)
        except TimeoutError:
            raise TimeoutError(f"none of {patterns} came within {timeout} seconds") from None
        self._unread = self._unread[match.end():]
        return match

    def _search(self, compiled: list[re.Pattern[str]]) -> re.Match[str] | None:
        found = [match for pattern in compiled if (match := pattern.search(self._unread))]
        return min(found, key=lambda match: match.start()) if found else None

    async def _read_until(self, compiled: list[re.Pattern[str]]) -> re.Match[str] | None:
        """Follows the output from where the last read stopped until a pattern matches (or the stream ends)."""
        handle = await self.sandbox.commands.connect(self.process_id)
        events = handle.events(self._offset)
        try:
            async for event in events:
                if event.type == "stdout" and event.data:
                    self._unread += event.data
                    self._offset = event.offset or self._offset
                    if match := self._search(compiled):
                        return match
                elif event.type == "gap":
                    self._offset = event.offset or self._offset
                elif event.type == "end":
                    raise Ended(f"the session's shell exited ({event.result.exit_code if event.result else '?'})")
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        return None

    async def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the command that runs in the foreground; the shell drops the rest of its line."""
        await self.sandbox.commands.send_stdin(self.process_id, "\x03")

    async def close(self) -> None:
        handle = await self.sandbox.commands.connect(self.process_id)
        await handle.delete()
