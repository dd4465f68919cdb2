"""Shell sessions: one command at a time written to a shell that lives on, SWE-agent style.

A session is a background process of the container (`processes`) whose program is a shell; each command is
written to its stdin and its output read back over one connection to the agent until markers printed after
it end its output.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
from typing import Protocol

from rollbox.engine.agent_client import ANSWER_TIMEOUT, _frame
from rollbox.errors import Conflict
from rollbox.models import ExecResult, ShellCommand

SHELL = "if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc; else exec /bin/sh; fi"
"""A shell session runs bash where the sandbox has it, else /bin/sh."""
INTERRUPT_GRACE = 1.0
"""Seconds a shell command has to end after its interrupt (SIGINT) before it is killed."""
KILL_GRACE = 10.0
"""Seconds a killed shell command has to be reported before the shell counts as stuck."""


class Session(Protocol):
    """A connection to the agent attached to the session's process, read frame by frame."""

    process_id: str

    async def send(self, *frames: bytes) -> None: ...
    async def frame(self) -> tuple[bytes, bytes]: ...


class _Kept:
    """One stream of a shell command: the first `limit` bytes, and a tail in which to look for its marker."""

    def __init__(self, marker: bytes, limit: int) -> None:
        self.marker = marker
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.end: int | None = None
        """Where the marker starts, once seen; what follows it up to its closing byte is its payload."""
        self.payload = b""

    def feed(self, data: bytes) -> None:
        if self.end is not None:
            return
        if len(self.head) < self.limit:
            self.head += data[:self.limit - len(self.head)]
        self.tail += data
        self.total += len(data)
        at = self.tail.find(self.marker)
        if at >= 0:
            close = self.tail.find(b"\x1e", at + len(self.marker))
            if close >= 0:
                self.end = self.total - len(self.tail) + at
                self.payload = bytes(self.tail[at + len(self.marker):close])
                return
            return  # the marker's payload is still coming: keep the tail whole
        keep = len(self.marker) + 32
        del self.tail[:-keep]

    @property
    def text(self) -> str:
        end = self.total if self.end is None else self.end
        return bytes(self.head[:end]).decode(errors="replace")

    @property
    def truncated(self) -> bool:
        return (self.total if self.end is None else self.end) > self.limit


class ShellRun:
    """One command in a shell session, SWE-agent style: written to the shell's stdin, with markers printed
    after it on stdout (with its exit status) and on stderr, which end its output.

    The command runs through `eval` (a syntax error fails the command, not the session) with stdin from
    /dev/null (it cannot eat the commands that follow). Its timeout interrupts everything the shell
    started (SIGINT, then SIGKILL) and never the shell, whose directory, variables and functions stay.
    """

    def __init__(self, connection: Session, command: ShellCommand, output_limit: int) -> None:
        self.connection = connection
        self.command = command
        nonce = secrets.token_hex(8)
        self.out = _Kept(f"\x1e{nonce}:".encode(), output_limit)
        self.err = _Kept(f"\x1e{nonce}:".encode(), output_limit)
        self.script = (f"eval {shlex.quote(command.command)} </dev/null\n"
                       f"printf '\\036{nonce}:%d\\036' \"$?\"; printf '\\036{nonce}:\\036' >&2\n")
        self.ended: ExecResult | None = None

    async def run(self) -> ExecResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        connection = self.connection
        async with asyncio.timeout(ANSWER_TIMEOUT):
            await connection.send(_frame(b"i", self.script.encode()), _frame(b"x", b""))
        timed_out = False
        if not await self._until_markers(self.command.timeout):
            timed_out = True
            for signal, grace in ((2, INTERRUPT_GRACE), (9, KILL_GRACE)):
                await connection.send(_frame(b"S", str(signal).encode()), _frame(b"x", b""))
                if await self._until_markers(grace):
                    break
            else:
                raise Conflict(f"shell session {connection.process_id}: the command did not end when killed; "
                               "delete the session and start a new one")
        status = self.out.payload.decode()
        return ExecResult(
            exit_code=None if timed_out else int(status), stdout=self.out.text, stderr=self.err.text,
            timed_out=timed_out, stdout_truncated=self.out.truncated, stderr_truncated=self.err.truncated,
            duration_ms=(loop.time() - started) * 1000)

    async def _until_markers(self, timeout: float | None) -> bool:
        """Reads output until both markers came (True) or `timeout` passed (False)."""
        try:
            async with asyncio.timeout(timeout):
                while self.out.end is None or self.err.end is None:
                    kind, payload = await self.connection.frame()
                    if kind == b"o":
                        self.out.feed(payload)
                    elif kind == b"r":
                        self.err.feed(payload)
                    elif kind == b"z":
                        raise Conflict(f"shell session {self.connection.process_id} ended (its shell exited): "
                                       "start a new one")
        except TimeoutError:
            return False
        return True
