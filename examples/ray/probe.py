"""Runs inside a sandbox (the example sends it as text): tries a TCP connection to every target it reads on stdin,
`{"targets": [[host, port], ...], "timeout": seconds}`, and prints a line per attempt as it ends:
`connected - HOST:PORT`, `refused ERRNO HOST:PORT` (ECONNREFUSED: nothing listens there; ENETUNREACH: the sandbox
has no route to that address) or `timed_out - HOST:PORT`. A target with no line was still trying when the command's
own timeout stopped it. Standard library only: it runs on the sandbox's Python."""

import errno
import json
import socket
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed


def attempt(host: str, port: int, timeout: float) -> str:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except TimeoutError:
        return f"timed_out - {host}:{port}"
    except OSError as error:
        return f"refused {errno.errorcode.get(error.errno or 0, 'EIO')} {host}:{port}"
    return f"connected - {host}:{port}"


def main() -> None:
    plan = json.load(sys.stdin)
    with ThreadPoolExecutor(64) as pool:
        for done in as_completed([pool.submit(attempt, host, port, plan["timeout"]) for host, port in plan["targets"]]):
            print(done.result(), flush=True)


main()
