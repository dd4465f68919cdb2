"""Another local user, for checking what the server's unix socket lets in."""

from __future__ import annotations

import os
import socket

NOBODY = 65534


def connect_as(uid: int, path: str) -> int:
    """Connects to `path` from a child process running as `uid`: 0, or the errno it got."""
    child = os.fork()
    if child == 0:  # only syscalls from here on, then _exit
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as attacker:
                attacker.connect(path)
            os._exit(0)
        except OSError as error:
            os._exit(error.errno or 255)
        finally:
            os._exit(255)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)
