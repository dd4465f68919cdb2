"""SWE-bench-shaped images, made here from this machine's own programs: a base with Python and git, environment
images on it, and an instance image per task holding its repository at /testbed, as SWE-bench's images do.

The base carries Debian's python3.11 (its standard library without tests and GUI parts) and git with the shared
libraries they load, over the busybox layer; nothing comes from outside.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from tests.support.registry import Files, Layer, busybox_layer, make_layer

PYTHON = Path("/usr/bin/python3.11")
GIT = Path("/usr/bin/git")
STDLIB = Path("/usr/lib/python3.11")
SKIPPED = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "__pycache__",
           "config-3.11-x86_64-linux-gnu")


def available() -> bool:
    return PYTHON.is_file() and GIT.is_file() and STDLIB.is_dir()


@functools.cache
def tools_layer() -> Layer:
    """python3 (also as `python`) and git, with the libraries they load."""
    files: Files = {str(PYTHON): PYTHON, str(GIT): GIT}
    for library in _libraries(PYTHON, GIT):
        files[str(library)] = library.resolve()
    for path in STDLIB.rglob("*"):
        relative = path.relative_to(STDLIB)
        if path.is_file() and not path.is_symlink() and not set(relative.parts) & set(SKIPPED):
            files[str(path)] = path
    symlinks = {"usr/bin/python3": "python3.11", "usr/bin/python": "python3.11"}
    return make_layer(files, symlinks=symlinks)


def base_layers() -> list[Layer]:
    return [busybox_layer(), tools_layer()]


def repository_layer(checkout: Path) -> Layer:
    """The checkout (its .git included) at /testbed."""
    files: Files = {}
    for path in sorted(checkout.rglob("*")):
        target = f"testbed/{path.relative_to(checkout)}"
        files[target] = None if path.is_dir() else path.read_bytes()
    files["testbed"] = None
    return make_layer(files)


def _libraries(*programs: Path) -> list[Path]:
    listed = subprocess.run(["ldd", *map(str, programs)], capture_output=True, text=True, check=True).stdout
    found = {Path(part) for line in listed.splitlines() for part in line.split() if part.startswith("/")}
    return sorted(path for path in found if path.exists())
