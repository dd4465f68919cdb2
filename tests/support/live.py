"""A process that holds state in memory only, to tell whether a sandbox's processes and memory carried over.

`memory_server.py` keeps a random secret (and, if asked, some megabytes) in one Python process and serves
it on the sandbox's loopback: `secret`, `pid`, `set:<value>`, and `sum` (of the held bytes).
"""

from __future__ import annotations

import time
from typing import Any

from rollbox.models import ExecResult

MEMORY_SERVER = "memory_server.py"
PORT = 7000
SOURCE = f"""
import os, secrets, socket, sys
held = bytearray(int(sys.argv[1]) * 2**20)
held[::4096] = b"x" * len(held[::4096])
state = {{"secret": secrets.token_hex(8)}}
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", {PORT}))
server.listen()
while True:
    conn, _ = server.accept()
    ask = conn.recv(100).decode()
    if ask.startswith("set:"):
        state["secret"] = ask[4:]
    answers = {{"secret": state["secret"], "pid": str(os.getpid()), "sum": str(sum(held[::4096]))}}
    conn.sendall(answers.get(ask, "").encode())
    conn.close()
"""
ASK = ("python3 -c 'import socket, sys; s = socket.create_connection((\"127.0.0.1\", {port})); "
       "s.sendall(sys.argv[1].encode()); print(s.recv(100).decode())' {what}")


def run(box: Any, command: str) -> ExecResult:
    """Runs a command in an engine's container or an SDK's sandbox."""
    return box.exec(command) if hasattr(box, "exec") else box.run(command)


def start_memory_server(box: Any, megabytes: int = 4, timeout: float = 30.0) -> None:
    """Starts the server in the background (in an engine's container or an SDK's sandbox) and waits until it
    answers."""
    box.files.write(f"/tmp/{MEMORY_SERVER}", SOURCE)
    run(box, f"nohup python3 /tmp/{MEMORY_SERVER} {megabytes} >/dev/null 2>&1 &")
    deadline = time.monotonic() + timeout
    while run(box, ASK.format(port=PORT, what="pid")).exit_code != 0:
        assert time.monotonic() < deadline, "the memory server did not start"
        time.sleep(0.05)


def ask(box: Any, what: str) -> str:
    """What the sandbox's memory server answers (`secret`, `pid`, `sum`)."""
    result = run(box, ASK.format(port=PORT, what=what))
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()
