"""agent-sandbox's in-cluster connection (`SandboxInClusterConnectionConfig`), as KubeRay's demo uses it: the client
reads the Sandbox's pod IP and talks to the runtime API there, with no token (docs/compat-agent-sandbox.md).

With `rollbox serve --in-cluster-connections` each sandbox's pod IP is a loopback address the router serves, and the
demo's manifest (gVisor, a registry image, a NetworkPolicy that allows name resolution alone) applies as written
once its registry is mirrored here; without the option, every call answers 403 naming the change to make.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from k8s_agent_sandbox import SandboxClient, SandboxRequestError
from k8s_agent_sandbox.models import SandboxInClusterConnectionConfig
from kubernetes import config

from rollbox.client import SandboxClient as RollboxClient
from rollbox.engine import Engine
from tests.support.cluster import ROLLBOX, Process, wait_for
from tests.support.engines import teardown_engine
from tests.support.kuberay_demo import DEMO
from tests.support.registry import ImageMaker, Layer, busybox_layer, make_layer, running_registry
from tests.support.servers import TEMPLATE

pytestmark = pytest.mark.slow
TOKEN = "alice-token-0123456789"
UPSTREAM = "registry.example.com"
"""The demo manifest's registry, mirrored to the test's own."""
PYTHON_LIBRARY = Path("/usr/lib/python3.11")
SKIPPED = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "distutils", "__pycache__",
           "site-packages", "dist-packages", "unittest", "turtledemo", "multiprocessing", "sqlite3", "curses",
           "venv", "xmlrpc", "wsgiref", "email", "asyncio", "http", "xml", "html", "urllib", "concurrent", "dbm"}
CODE = "a, b = 0, 1\nfor _ in range(20):\n    a, b = b, a + b\nprint(f'fib(20) = {a}')\n"


def python_layer() -> Layer:
    """The host's Python, its shared libraries and the standard library it starts with: a runtime image's."""
    files: dict[str, bytes | str | Path | None] = {"/usr/bin/python3.11": Path("/usr/bin/python3.11")}
    for library in ("libm.so.6", "libz.so.1", "libexpat.so.1", "libc.so.6"):
        files[f"/lib/x86_64-linux-gnu/{library}"] = Path("/lib/x86_64-linux-gnu") / library
    files["/lib64/ld-linux-x86-64.so.2"] = Path("/lib64/ld-linux-x86-64.so.2")
    for path in PYTHON_LIBRARY.rglob("*"):
        relative = path.relative_to(PYTHON_LIBRARY)
        if path.is_file() and not path.is_symlink() and not SKIPPED & set(relative.parts):
            files[f"/usr/lib/python3.11/{relative}"] = path
    return make_layer(files, symlinks={"/usr/bin/python": "python3.11", "/usr/bin/python3": "python3.11"})


def start(root: Path, *options: str) -> Process:
    process = Process(["serve", "--data-dir", str(root / "data"), "--token", f"alice={TOKEN}", "--admin", "alice",
                       "--delete-on-exit", *options], root / "serve.log")
    process.start()
    return process


def kubeconfig(root: Path, url: str) -> str:
    path = root / "kubeconfig"
    subprocess.run([str(ROLLBOX), "kubeconfig", "--url", url, "--token", TOKEN, "-o", str(path)], check=True,
                   capture_output=True)
    return str(path)


@pytest.fixture(scope="module")
def in_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Process, Path]]:
    """A router serving in-cluster connections, with the demo's manifest applied from a mirrored registry."""
    root = tmp_path_factory.mktemp("in-cluster")
    with running_registry(root / "registry") as registry:
        maker = ImageMaker(root / "images")
        maker.image("v0.4.6", [busybox_layer(), python_layer()], env={"PATH": "/usr/bin:/bin"})
        registry.push(maker, "v0.4.6", "agent-sandbox/python-runtime-sandbox")
        process = start(root, "--in-cluster-connections", "--registry-mirror", f"{UPSTREAM}={registry.host}",
                        "--insecure-registry", registry.host)
        try:
            (root / "sandbox.yaml").write_text(DEMO)
            subprocess.run([str(ROLLBOX), "apply", "-f", str(root / "sandbox.yaml"), "--url", process.url,
                            "--token", TOKEN], check=True, capture_output=True, timeout=600)
            with RollboxClient(process.url, token=TOKEN) as client:
                wait_for(lambda: client.get_warmpool("python-runtime-pool").ready == 2, "the pool fills", 300)
            yield process, root
        finally:
            process.stop()
            teardown_engine(Engine(root / "data"))


def test_the_demos_in_cluster_calls_run_code_in_its_sandboxes(in_cluster: tuple[Process, Path]) -> None:
    process, root = in_cluster
    client = SandboxClient(connection_config=SandboxInClusterConnectionConfig(server_port=8888), cleanup=True,
                           api_client=config.new_client_from_config(kubeconfig(root, process.url)))
    sandbox = client.create_sandbox(warmpool="python-runtime-pool")
    pod_ip = sandbox.get_pod_ip()
    assert pod_ip is not None and pod_ip.startswith("127.") and pod_ip != "127.0.0.1"
    sandbox.files.write("compute_fib.py", CODE)
    result = sandbox.commands.run("python compute_fib.py", timeout=30)
    assert (result.exit_code, result.stdout) == (0, "fib(20) = 6765\n")
    probe = sandbox.commands.run("python -c \"import socket; s=socket.socket(); s.settimeout(2); "
                                 "print(s.connect_ex(('169.254.20.10', 53)))\"", timeout=30)
    assert probe.stdout.strip() != "0"  # the policy's DNS gives it no way out
    own = sandbox.commands.run(f"python -c \"import socket; s=socket.socket(); s.settimeout(2); "
                               f"print(s.connect_ex(('{pod_ip}', 8888)))\"", timeout=30)
    assert own.stdout.strip() != "0"  # inside, the pod address is the sandbox's own loopback: no router there
    client.delete_sandbox(sandbox.claim_name)
    with pytest.raises(httpx.ConnectError):  # the address closed with its sandbox
        httpx.post(f"http://{pod_ip}:8888/execute", json={"command": "true"}, timeout=10)


def test_without_the_option_the_demo_is_told_what_to_change(tmp_path: Path) -> None:
    process = start(tmp_path)
    try:
        with RollboxClient(process.url, token=TOKEN) as rollbox:
            rollbox.apply(TEMPLATE + "---\napiVersion: rollbox.dev/v1alpha1\nkind: SandboxWarmPool\n"
                                     "metadata: {name: pool}\nspec: {sandboxTemplateRef: {name: basic}, replicas: 1}\n")
        client = SandboxClient(connection_config=SandboxInClusterConnectionConfig(server_port=8888),
                               api_client=config.new_client_from_config(kubeconfig(tmp_path, process.url)))
        sandbox = client.create_sandbox(warmpool="pool")
        with pytest.raises(SandboxRequestError) as refused:
            sandbox.commands.run("true", timeout=10)
        assert refused.value.status_code == 403  # not a network fault: an answer, naming the change to make
        assert "rollbox serve --in-cluster-connections" in refused.value.response.json()["detail"]
        client.delete_sandbox(sandbox.claim_name)
    finally:
        process.stop()
        teardown_engine(Engine(tmp_path / "data"))
