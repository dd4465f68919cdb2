"""Builds the exec agent: a static binary, so it runs in any root filesystem (even one without libc).

Also builds `compat.so`, preloaded into commands under runtimes with known syscall gaps, and `determinism.so`,
preloaded into a deterministic sandbox's commands. Both are
compiled once per source version and cached; sandboxes bind-mount them read-only. The agent's files
and what each does are listed in `agent.h`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from rollbox.errors import RuntimeUnavailable

HERE = Path(__file__).parent
AGENT_SOURCES = tuple(HERE / name for name in ("agent.c", "wire.c", "command.c", "tree.c", "run.c", "processes.c",
                                                "background.c", "supervisor.c", "ring.c", "det.c", "port.c"))
AGENT_HEADERS = (HERE / "agent.h", HERE / "det.h")
"""What the agent's sources include: a change to one builds the agent again."""
COMPAT_SOURCE = HERE / "compat.c"
DETERMINISM_SOURCES = (HERE / "determinism.c", HERE / "fixed_stack.c")


def agent_binary(cache_dir: Path) -> Path:
    """Returns the path of the compiled agent, compiling it into `cache_dir` if needed."""
    return _compile(AGENT_SOURCES, cache_dir, "agent", ["-static"], AGENT_HEADERS)


def compat_library(cache_dir: Path) -> Path:
    """Returns the path of the compiled compat library, compiling it into `cache_dir` if needed."""
    return _compile((COMPAT_SOURCE,), cache_dir, "compat.so", ["-shared", "-fPIC"])


def determinism_library(cache_dir: Path) -> Path:
    """Returns the path of the library preloaded into a deterministic sandbox's commands (docs/determinism.md)."""
    return _compile(DETERMINISM_SOURCES, cache_dir, "determinism.so", ["-shared", "-fPIC"], (HERE / "det.h",))


def _compile(sources: tuple[Path, ...], cache_dir: Path, name: str, flags: list[str],
             headers: tuple[Path, ...] = ()) -> Path:
    source = b"".join(path.read_bytes() for path in (*sources, *headers))
    target = cache_dir / f"{hashlib.sha256(source).hexdigest()[:16]}-{name}"
    if target.exists():
        return target
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeUnavailable("no C compiler found: install gcc and libc6-dev to build the exec agent")
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    result = subprocess.run(
        [compiler, *flags, "-O2", "-Wall", "-o", str(partial), *map(str, sources)],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise RuntimeUnavailable(f"building {name} failed (is libc6-dev installed?):\n{result.stderr}")
    os.replace(partial, target)
    return target
