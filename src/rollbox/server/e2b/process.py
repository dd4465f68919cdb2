"""E2B's process service over a `Node`: every command runs as one of the node's background processes
(docs/processes.md), since the SDK asks for a foreground and a background command alike.

A started process is followed until it ends, then deleted in the background: its end is told, so nothing of
it is kept to read back. A handle may kill it, write its stdin or let go of it and connect again later; it is
found again by its pid or its tag.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.message import Message

from rollbox.errors import NodeLost, NotFound, SandboxNotFound, SandboxNotRunning, from_code
from rollbox.models import ExecResult, ProcessControl, ProcessInfo, ProcessRequest, PtySize
from rollbox.node import Node
from rollbox.server.e2b.caller import Sandbox, basic_user, rpc_error
from rollbox.server.e2b.connect import Call, Method, RpcError
from rollbox.server.e2b.protocol import message_class as P

log = logging.getLogger("rollbox.server.e2b")


class ProcessService:
    """`/process.Process/*`."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._forgetting: set[asyncio.Future[None]] = set()
        self.methods: dict[str, Method] = {
            "/process.Process/Start": Method(P("process.StartRequest"), self.start, streaming=True),
            "/process.Process/Connect": Method(P("process.ConnectRequest"), self.connect, streaming=True),
            "/process.Process/List": Method(P("process.ListRequest"), self.list_processes),
            "/process.Process/SendSignal": Method(P("process.SendSignalRequest"), self.send_signal),
            "/process.Process/SendInput": Method(P("process.SendInputRequest"), self.send_input),
            "/process.Process/StreamInput": Method(P("process.StreamInputRequest"), self.stream_input,
                                                   client_streaming=True),
            "/process.Process/CloseStdin": Method(P("process.CloseStdinRequest"), self.close_stdin),
            "/process.Process/Update": Method(P("process.UpdateRequest"), self.update),
        }

    async def start(self, call: Call, request: Any) -> AsyncIterator[Message]:
        """Starts a background process and follows it: a foreground `commands.run` and a background handle send the
        same call, and a handle may kill it, write its stdin or let go of it and connect again later."""
        sandbox: Sandbox = call.context
        config = request.process
        size = request.pty.size if request.HasField("pty") else None
        info = await self.node.start_process(sandbox.tenant, sandbox.id, ProcessRequest(
            command=[config.cmd, *config.args], env=dict(config.envs) or None,
            cwd=config.cwd if config.HasField("cwd") else None,
            user=basic_user(call.request.headers.get("authorization")),
            pty=PtySize(rows=size.rows or 24, cols=size.cols or 80) if size is not None else None,
            close_stdin=request.HasField("stdin") and not request.stdin, timeout=call.timeout(),
            tag=request.tag if request.HasField("tag") else None))
        async for event in self._follow(sandbox, info.id, 0, pty=size is not None):
            yield event

    async def connect(self, call: Call, request: Any) -> AsyncIterator[Message]:
        """Follows a running process again, from its output of now on."""
        sandbox: Sandbox = call.context
        info = await self._find(sandbox, request.process)
        async for event in self._follow(sandbox, info.id, None, pty=info.pty, response="process.ConnectResponse"):
            yield event

    async def _follow(self, sandbox: Sandbox, process_id: str, offset: int | None, *, pty: bool,
                      response: str = "process.StartResponse") -> AsyncIterator[Message]:
        try:
            async for message in self._events(sandbox, process_id, offset, pty, response):
                yield message
        except (SandboxNotFound, SandboxNotRunning, NodeLost) as error:
            # As E2B's daemon ends a stream whose sandbox went away: "unavailable" without saying why, so the SDK
            # asks the sandbox's health and tells its caller the sandbox was killed.
            raise RpcError("unavailable", f"the connection to sandbox {sandbox.id} ended before the stream "
                                          "completed") from error

    async def _events(self, sandbox: Sandbox, process_id: str, offset: int | None, pty: bool, response: str
                      ) -> AsyncIterator[Message]:
        async for event in self.node.process_events(sandbox.tenant, sandbox.id, process_id, offset):
            if event.type == "start":
                yield _event(response, start={"pid": event.pid or 0})
            elif event.type in ("stdout", "stderr"):
                yield _event(response, data={"pty" if pty else event.type: event.data.encode()})
            elif event.type == "error":
                error = from_code(event.code or "internal", event.message or "the process was lost")
                raise error if isinstance(error, SandboxNotFound | SandboxNotRunning | NodeLost) else rpc_error(error)
            elif event.type == "end" and event.result is not None:
                self._forget(sandbox, process_id)
                if event.result.timed_out:
                    raise RpcError("deadline_exceeded", "the command ran past its timeout and was killed")
                yield _event(response, end=_end(event.result))
                return

    def _forget(self, sandbox: Sandbox, process_id: str) -> None:
        """Deletes an ended process in the background: its end is told, so nothing of it is kept to read back, and
        the stream closes without waiting."""
        task = asyncio.ensure_future(self.node.delete_process(sandbox.tenant, sandbox.id, process_id))
        self._forgetting.add(task)
        task.add_done_callback(self._forgotten)

    def _forgotten(self, task: asyncio.Future[None]) -> None:
        self._forgetting.discard(task)
        if not task.cancelled() and isinstance(task.exception(), Exception) and not isinstance(
                task.exception(), NotFound | SandboxNotRunning | NodeLost):
            log.warning("could not delete an ended process", exc_info=task.exception())

    async def _find(self, sandbox: Sandbox, selector: Any) -> ProcessInfo:
        """The process a selector names by pid or tag: a running one before one that ended."""
        field = selector.WhichOneof("selector")
        value = getattr(selector, field) if field else None
        found = sorted((info for info in await self.node.processes(sandbox.tenant, sandbox.id)
                        if getattr(info, field or "pid") == value), key=lambda info: (info.running, info.started_at))
        if not found:
            raise RpcError("not_found", f"no process with {field} {value!r}")
        return found[-1]

    async def _control(self, call: Call, selector: Any, control: ProcessControl) -> None:
        sandbox: Sandbox = call.context
        info = await self._find(sandbox, selector)
        await self.node.control_process(sandbox.tenant, sandbox.id, info.id, control)

    async def list_processes(self, call: Call, request: Any) -> Message:
        sandbox: Sandbox = call.context
        answer = P("process.ListResponse")()
        for info in await self.node.processes(sandbox.tenant, sandbox.id):
            if info.running:
                entry = answer.processes.add(pid=info.pid)
                entry.config.cmd, *args = info.command or [""]
                entry.config.args.extend(args)
                if info.cwd is not None:
                    entry.config.cwd = info.cwd
                if info.tag is not None:
                    entry.tag = info.tag
        return answer

    async def send_signal(self, call: Call, request: Any) -> Message:
        """A process that ended is not found, as by envd, even while its record waits to be forgotten."""
        sandbox: Sandbox = call.context
        info = await self._find(sandbox, request.process)
        if not info.running:
            raise RpcError("not_found", f"process {info.pid} has ended")
        await self.node.control_process(sandbox.tenant, sandbox.id, info.id,
                                        ProcessControl(signal=request.signal or signal.SIGKILL))
        return P("process.SendSignalResponse")()

    async def send_input(self, call: Call, request: Any) -> Message:
        data = getattr(request.input, request.input.WhichOneof("input") or "stdin")
        await self._control(call, request.process, ProcessControl(stdin=data.decode(errors="replace")))
        return P("process.SendInputResponse")()

    async def stream_input(self, call: Call, requests: AsyncIterator[Any]) -> Message:
        """Input in order over one stream: the process first, then its data."""
        sandbox: Sandbox = call.context
        target: ProcessInfo | None = None
        async for message in requests:
            kind = message.WhichOneof("event")
            if kind == "start":
                target = await self._find(sandbox, message.start.process)
            elif kind == "data":
                if target is None:
                    raise RpcError("failed_precondition", "name the process in the stream's first message")
                data = getattr(message.data.input, message.data.input.WhichOneof("input") or "stdin")
                await self.node.control_process(sandbox.tenant, sandbox.id, target.id,
                                                ProcessControl(stdin=data.decode(errors="replace")))
        return P("process.StreamInputResponse")()

    async def close_stdin(self, call: Call, request: Any) -> Message:
        await self._control(call, request.process, ProcessControl(close_stdin=True))
        return P("process.CloseStdinResponse")()

    async def update(self, call: Call, request: Any) -> Message:
        if request.HasField("pty"):
            size = request.pty.size
            await self._control(call, request.process, ProcessControl(resize=PtySize(rows=size.rows or 24,
                                                                                      cols=size.cols or 80)))
        return P("process.UpdateResponse")()


def _event(response: str, **event: Any) -> Message:
    answer = P(response)()
    for name, fields in event.items():
        getattr(answer.event, name).SetInParent()
        for key, value in fields.items():
            setattr(getattr(answer.event, name), key, value)
    return answer


def _end(result: ExecResult) -> dict[str, Any]:
    if result.signal:
        name = signal.Signals(result.signal).name.removeprefix("SIG").lower() if result.signal < 65 else result.signal
        return {"exit_code": -1, "exited": False, "status": f"signal: {name}"}
    return {"exit_code": result.exit_code or 0, "exited": True, "status": f"exit status {result.exit_code}"}
