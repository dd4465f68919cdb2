"""Whether a request's caller is still there to read its answer: asked of the connection's socket itself.

The server learns that a caller hung up only when its event loop reads the connection's end, which under load, or
after the process was stopped (SIGSTOP) with requests queued, comes after the request has been served. A claim
answered to nobody leaves a sandbox nobody holds (docs/faults.md), so a claim asks the socket directly: a peek that
finds the stream's end (or a reset) means the caller is gone. Where the server gives no socket (an app in-process),
Starlette's view of the connection answers.
"""

from __future__ import annotations

import socket

from starlette.requests import Request


async def hung_up(request: Request) -> bool:
    connection = _socket(request)
    if connection is None:
        return await request.is_disconnected()
    peek = socket.socket(fileno=connection.fileno())
    try:
        return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:  # nothing to read: the caller is there, waiting
        return False
    except OSError:  # reset
        return True
    finally:
        peek.detach()


def _socket(request: Request) -> socket.socket | None:
    """The socket under uvicorn's request (its cycle's transport), if the request came through one."""
    transport = getattr(getattr(request.receive, "__self__", None), "transport", None)
    connection = transport.get_extra_info("socket") if transport is not None else None
    return connection if connection is not None and connection.fileno() >= 0 else None
