"""SWE-bench-shaped images, made here from this machine's own programs: a base with Python and git, environment
images on it, and an instance image per task holding its repository at /testbed, as SWE-bench's images do.

The base carries Debian's python3.11 (its standard library without tests and GUI parts) and git with the shared
libraries they load, over the busybox layer; nothing comes from outside.
"""

from __future__ import annotations

import functools
import json
import secrets
import shutil
import subprocess
from pathlib import Path

from tests.support.registry import Files, ImageMaker, Layer, Registry, busybox_layer, make_layer

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


def swe_family(maker: ImageMaker, registry: Registry, envs: int, per_env: int) -> list[str]:
    """A base (busybox, python, git), `envs` environment images on it, `per_env` instance images on each."""
    base = base_layers()
    references = []
    for env in range(envs):
        env_layer = make_layer({f"usr/lib/python3/env{env}/mod{n}.py": f"VALUE = {n}\n" + "#" * 4000
                                for n in range(2000)})
        for instance in range(per_env):
            repo = {f"testbed/pkg/file{n}.py": f"# {env}/{instance}/{n}\n" + secrets.token_hex(400)
                    for n in range(200)}
            tag = f"env{env}-task{instance}"
            maker.image(tag, [*base, env_layer, make_layer(repo)], workdir="/testbed")
            references.append(registry.push(maker, tag, f"swe/sweb.eval.{tag}", as_tag="latest"))
    return references


def distinct_blobs(maker: ImageMaker, references: list[str]) -> set[Path]:
    """The layer blobs of the images `swe_family` pushed as `references`, each once."""
    index = json.loads((maker.layout / "index.json").read_text())
    tags = {reference.rsplit("/", 1)[-1].split(":", 1)[0].removeprefix("sweb.eval.") for reference in references}
    blobs = set()
    for entry in index["manifests"]:
        if entry["annotations"]["org.opencontainers.image.ref.name"] in tags:
            manifest = json.loads((maker.layout / "blobs/sha256" / entry["digest"][7:]).read_text())
            blobs |= {maker.layout / "blobs/sha256" / layer["digest"][7:] for layer in manifest["layers"]}
    return blobs


def unpacked_alone(blobs: set[Path], scratch: Path) -> int:
    """What the layers take on disk each unpacked on its own by tar (the reference for a store's size)."""
    total = 0
    for blob in blobs:
        scratch.mkdir()
        subprocess.run(["tar", "-xzf", str(blob), "-C", str(scratch)], check=True, capture_output=True)
        total += disk_bytes(scratch)
        shutil.rmtree(scratch)
    return total


def disk_bytes(*paths: Path) -> int:
    if not paths:
        return 0
    done = subprocess.run(["du", "-s", "-c", "-B1", *map(str, paths)], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1].split()[0])


def _libraries(*programs: Path) -> list[Path]:
    listed = subprocess.run(["ldd", *map(str, programs)], capture_output=True, text=True, check=True).stdout
    found = {Path(part) for line in listed.splitlines() for part in line.split() if part.startswith("/")}
    return sorted(path for path in found if path.exists())
