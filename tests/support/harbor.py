"""Harbor against a real `rollbox serve`: Harbor-format tasks written here (a Dockerfile FROM a base image pushed to
a registry on loopback, tests/, solution/), the base image made from this machine's own programs (busybox, bash,
python3.11), and `harbor run` in Harbor's own virtualenv (Harbor needs Python 3.12; scripts/setup.sh makes
`.venv-harbor`). Shared by tests/rl/test_harbor.py, examples/harbor's test and bench/harbor.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollbox import errors
from rollbox.client import SandboxClient
from rollbox.engine import Engine
from tests.support.engines import teardown_engine
from tests.support.registry import ImageMaker, Layer, Registry, busybox_layer, make_layer
from tests.support.swe_images import _libraries, available, tools_layer

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
ENVIRONMENT = "rollbox.rl.adapters.harbor:RollboxEnvironment"
BASH = Path("/bin/bash")
APPLETS = ("tar", "gzip", "gunzip", "chmod", "chown", "cp", "mv", "ln", "sed", "awk", "tr", "sort", "uniq", "cut",
           "xargs", "basename", "dirname", "uname", "whoami", "date", "seq", "expr", "printf", "tail", "tee", "diff",
           "ip", "hostname", "timeout", "which", "readlink")
BASE_REPOSITORY = "harbor/base"


def missing() -> str | None:
    """Why Harbor's tests cannot run here, or None."""
    if not HARBOR.is_file():
        return "needs Harbor's virtualenv .venv-harbor (scripts/setup.sh makes it with a Python 3.12)"
    if not (available() and BASH.is_file()):
        return "needs busybox-static, Debian's python3.11, git and bash"
    return None


def base_layers() -> list[Layer]:
    """A base as Harbor's tasks expect one: a shell and the usual tools (busybox), bash, python3."""
    applets = make_layer({}, symlinks={f"bin/{applet}": "busybox" for applet in APPLETS})
    bash = make_layer({str(BASH): BASH, **{str(library): library.resolve() for library in _libraries(BASH)}})
    return [busybox_layer(), applets, tools_layer(), bash]


def push_base(registry: Registry, maker: ImageMaker) -> str:
    """Pushes the base to the registry; returns its reference, for the tasks' FROM lines."""
    maker.image("harbor-base", base_layers(), env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, workdir="/")
    return registry.push(maker, "harbor-base", BASE_REPOSITORY, as_tag="1")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    environment: int
    """Tasks with the same environment number have the same environment/ (one template for all of them)."""
    factor: int


def write_task(root: Path, base: str, task: TaskSpec, *, network_mode: str | None = None,
               prebuilt: bool = False) -> Path:
    """A Harbor task: sum the numbers of its environment's file, times `factor`, into /app/answer.txt. `prebuilt`:
    the task names `base` as its docker_image instead of building a Dockerfile FROM it (Harbor then uploads
    environment/ into the workdir)."""
    directory = root / task.name
    numbers = [task.environment * 7 + n for n in range(1, 11)]
    files = {
        "task.toml": _task_toml(network_mode, base if prebuilt else None),
        "instruction.md": f"Write the sum of the numbers in /app/data/numbers.txt, times {task.factor}, to "
                          "/app/answer.txt.\n",
        "environment/data/numbers.txt": "\n".join(map(str, numbers)) + "\n",
        "solution/solve.sh": "#!/bin/bash\nset -euo pipefail\ncd /app\n"
                             "python3 -c \"import sys; print(sum(map(int, open('data/numbers.txt').read().split()))"
                             f" * {task.factor})\" > answer.txt\n",
        "tests/test.sh": "#!/bin/bash\nif python3 /tests/test_answer.py; then echo 1 > /logs/verifier/reward.txt; "
                         "else echo 0 > /logs/verifier/reward.txt; fi\n",
        "tests/test_answer.py": textwrap.dedent(f"""\
            import os, sys
            expected = {sum(numbers) * task.factor}
            if not os.path.isfile("/app/answer.txt"):
                sys.exit("no /app/answer.txt")
            got = int(open("/app/answer.txt").read().strip())
            print("expected", expected, "got", got)
            sys.exit(0 if got == expected else 1)
            """),
    }
    if not prebuilt:
        files["environment/Dockerfile"] = (
            f"FROM {base}\nWORKDIR /app\nCOPY data/ /app/data/\n"
            "RUN python3 -c \"print(len(open('/app/data/numbers.txt').read().split()))\" > /app/data/count\n")
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if relative.endswith(".sh"):
            path.chmod(0o755)
    return directory


def _task_toml(network_mode: str | None, image: str | None) -> str:
    environment = ["build_timeout_sec = 600.0", "cpus = 1", "memory_mb = 512", "storage_mb = 256"]
    if network_mode:
        environment.append(f'network_mode = "{network_mode}"')
    if image:
        environment += [f'docker_image = "{image}"', 'workdir = "/app"']
    ready = "/app/data/numbers.txt" if image else "/app/data/count"
    return "\n".join(['schema_version = "1.4"', "[metadata]", "[verifier]", "timeout_sec = 120.0", "[agent]",
                      "timeout_sec = 120.0", "[environment]", *environment, "[environment.healthcheck]",
                      f'command = "test -f {ready}"']) + "\n"


def write_tasks(root: Path, base: str, count: int, environments: int) -> list[TaskSpec]:
    """`count` tasks over `environments` distinct environments."""
    specs = [TaskSpec(f"sum-{number:02d}", number % environments, number + 2) for number in range(count)]
    for spec in specs:
        write_task(root, base, spec)
    return specs


@contextlib.contextmanager
def rollbox_serve(data_dir: Path, registry: str) -> Iterator[str]:
    """`rollbox serve` in a child process on a unix socket, reaching the loopback `registry` over plain HTTP, and
    through it as Docker Hub's mirror (as a public dataset's `FROM python:3.11-slim` is pulled); yields its URL.
    Stopping it deletes its sandboxes; then its engine's templates and mounts go too."""
    data_dir.mkdir(parents=True, exist_ok=True)
    socket = data_dir.parent / f"{data_dir.name}.sock"
    argv = [sys.executable, "-c", "from rollbox.cli import main; main()", "serve", "--data-dir", str(data_dir),
            "--socket", str(socket), "--insecure-registry", registry,
            "--registry-mirror", f"docker.io={registry}", "--delete-on-exit", "--max-sandboxes", "32"]
    process = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    url = f"unix://{socket}"
    try:
        _wait_healthy(url, process)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        teardown_engine(Engine(data_dir))


def _wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    with SandboxClient(url, timeout=2) as client:
        while True:
            assert process.poll() is None, "rollbox serve exited at start"
            with contextlib.suppress(errors.RollboxError):
                client.health()
                return
            assert time.monotonic() < deadline, "rollbox serve did not come up"
            time.sleep(0.1)


def harbor_run(url: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """`harbor run` with `arguments`, reaching rollbox at `url`; the tests' own agents are importable
    (`tests.support.harbor_probe:ProbeAgent`)."""
    env = {**os.environ, "ROLLBOX_URL": url, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "HARBOR_TELEMETRY": "0"}
    return subprocess.run([str(HARBOR), "run", "--yes", *arguments], env=env, capture_output=True, text=True,
                          timeout=1800)


def run_flags(tasks: Path, jobs: Path, job: str, agent: str, concurrency: int) -> list[str]:
    """The flags of a `harbor run` over a task directory with the rollbox environment."""
    return ["--path", str(tasks), "--agent", agent, "--env", ENVIRONMENT, "--jobs-dir", str(jobs), "--job-name", job,
            "--n-concurrent", str(concurrency), "--quiet"]


def trial_results(job_dir: Path) -> dict[Path, dict[str, Any]]:
    """Harbor's result.json of each trial of a job, by the trial's directory."""
    return {path.parent: json.loads(path.read_text()) for path in sorted(job_dir.glob("*/result.json"))}


def reward(result: dict[str, Any]) -> float | None:
    verifier = result.get("verifier_result") or {}
    return (verifier.get("rewards") or {}).get("reward")


def agent(result: dict[str, Any]) -> str:
    return str(result["agent_info"]["name"])
