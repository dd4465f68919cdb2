"""Builds the exec agent: a static binary, so it runs in any root filesystem (even one without libc).

The binary is compiled once per source version and cached; sandboxes bind-mount it read-only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from rollbox.errors import RuntimeUnavailable

SOURCE = Path(__file__).with_name("agent.c")


def agent_binary(cache_dir: Path) -> Path:
    """Returns the path of the compiled agent, compiling it into `cache_dir` if needed."""
    source = SOURCE.read_bytes()
    target = cache_dir / f"agent-{hashlib.sha256(source).hexdigest()[:16]}"
    if target.exists():
        return target
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeUnavailable("no C compiler found: install gcc and libc6-dev to build the exec agent")
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run(
        [compiler, "-static", "-O2", "-Wall", "-o", str(partial), str(SOURCE)],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise RuntimeUnavailable(f"building the exec agent failed (is libc6-dev installed?):\n{result.stderr}")
    os.replace(partial, target)
    return target
