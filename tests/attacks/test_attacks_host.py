"""Attacks on the host from inside: its files, its environment, its processes, the engine's socket.

The sandbox sees its own root filesystem (plus the host's /usr, read-only), its own pid namespace
and only the environment the engine gives it. Each test looks for a concrete host secret (a canary
file, an environment variable, a process) from inside, as the default user and as root, and
fails if it shows up; signals and ptrace aimed at host processes must leave them running.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Container, Engine
from rollbox.errors import InvalidRequest, SandboxNotRunning
from tests.attacks.attack_support import Host, Neighbour, answers_or_resets, check_run_dir, new_sandbox

USERS = pytest.mark.parametrize("user", [None, "root"], ids=["user", "root"])


@USERS
def test_host_files_are_not_visible(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host,
                                    user: str | None) -> None:
    """Host secrets: /etc/shadow, /root, the host's /etc, pyenv, the engine's data and socket directories."""
    engine_paths = [attack_engine.data_dir, attack_engine.data_dir / "state.db", attack_engine.run_dir,
                    attack_engine.launcher.rootfs(neighbour.sandbox.id), attack_engine.launcher.agent,
                    attack_engine.run_dir / box.id / "agent.sock", Path(sys.prefix), Path(sys.executable)]
    paths = [host.secret_file, host.root_canary, Path("/root/.pyenv"), Path("/work"), Path("/etc/fstab"),
             *engine_paths]
    probe = "; ".join(f"test -e '{path}' && echo 'VISIBLE {path}'" for path in paths)
    secret = host.secret.decode().strip()
    search = f"grep -rlsF '{secret}' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr --exclude-dir=dev"
    result = box.exec(f"{probe}; {search}; ls -A /root", user=user)
    assert "VISIBLE" not in result.stdout and secret not in result.stdout, result
    assert ".pyenv" not in result.stdout and host.root_canary.name not in result.stdout, result
    # The sandbox's /etc/shadow is its own, empty one (unreadable to the default user).
    shadow = box.exec("cat /etc/shadow; echo rc=$?", user=user)
    assert shadow.stdout == ("rc=0\n" if user == "root" else "rc=1\n"), shadow
    # The host's /etc stays private: only the few files the host base copies come through.
    host_only = [name for name in ("fstab", "machine-id", "crontab", "sudoers", "ssh", "apt", "gshadow")
                 if os.path.exists(f"/etc/{name}")]
    listing = set(box.exec("ls -A /etc", user=user).stdout.split())
    assert not listing & set(host_only), listing & set(host_only)
    host.check()
    neighbour.check()


def test_host_private_keys_are_not_copied(tmp_path: Path, runtime_name: str) -> None:
    """The host base copies /etc/ssl for its certificates: the host's private keys must stay behind."""
    from tests.support.engines import make_engine, teardown_engine

    key = Path("/etc/ssl/private") / f"rollbox-attack-{secrets.token_hex(6)}.key"
    if not key.parent.is_dir():
        pytest.skip("the host has no /etc/ssl/private")
    key.write_text("-----BEGIN PRIVATE KEY-----\nhost secret\n")
    key.chmod(0o600)
    engine = make_engine(tmp_path)
    try:
        from rollbox.spec import SandboxTemplate

        engine.build(SandboxTemplate.model_validate({"metadata": {"name": "keys"},
                                                     "spec": {"runtime": runtime_name}}))
        with engine.create("keys") as box:
            result = box.exec(f"ls -A /etc/ssl/ /etc/ssl/private; cat /etc/ssl/private/{key.name}", user="root")
        assert "host secret" not in result.stdout and key.name not in result.stdout, result
        assert "certs" in result.stdout, "the host base no longer copies /etc/ssl at all"
    finally:
        key.unlink()
        teardown_engine(engine)


@pytest.fixture
def host_secret_env() -> Iterator[str]:
    """A secret in the environment of the process running the engine (and so of the runtime it spawns)."""
    value = secrets.token_hex(16)
    os.environ["ROLLBOX_ATTACK_SECRET"] = value
    try:
        yield value
    finally:
        del os.environ["ROLLBOX_ATTACK_SECRET"]


@USERS
def test_host_environment_is_not_visible(attack_engine: Engine, runtime_name: str, host_secret_env: str,
                                         user: str | None) -> None:
    """The engine's environment must not leak into the sandbox: not into commands, not into its init."""
    with new_sandbox(attack_engine, runtime_name) as box:
        result = box.exec("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'", user=user)
        assert result.exit_code == 0, result
        assert "ROLLBOX_ATTACK_SECRET" not in result.stdout and host_secret_env not in result.stdout


@USERS
def test_host_processes_are_not_visible(box: Container, neighbour: Neighbour, user: str | None) -> None:
    """The sandbox's ps must show its agent and its own commands, nothing of the host or the neighbour."""
    marker = f"rollbox-attack-{secrets.token_hex(6)}"
    victim = subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 600"])
    try:
        result = box.exec("ps -eo pid=,args=; ls /proc | grep -c '^[0-9]'", user=user)
        lines = result.stdout.splitlines()
        processes = [line.split(None, 1) for line in lines[:-1]]
        assert processes[0][0] == "1" and processes[0][1].startswith("/.rollbox/agent "), processes
        assert marker not in result.stdout and "pytest" not in result.stdout and "sleep 100000" not in result.stdout
        assert int(lines[-1]) < 10, result.stdout
    finally:
        victim.kill()
        victim.wait()


BOOT_ID = "/proc/sys/kernel/random/boot_id"


@USERS
def test_the_host_boot_id_does_not_show_and_cannot_be_replaced(box: Container, neighbour: Neighbour,
                                                               user: str | None) -> None:
    """The host's boot id would tell a tenant which other tenants' sandboxes share its machine: each sandbox reads
    its own (under runc; gVisor's /proc has none), and root inside can neither write it nor uncover the host's."""
    host_id = Path(BOOT_ID).read_text().strip()
    own = box.exec(f"cat {BOOT_ID}", user=user).stdout.strip()
    theirs = neighbour.sandbox.exec(f"cat {BOOT_ID}").stdout.strip()
    assert host_id not in own and host_id not in theirs
    if own:
        assert own != theirs and len(own) == 36, (own, theirs)
    attempt = box.exec(f"echo {host_id} > {BOOT_ID}; umount {BOOT_ID}; umount -l {BOOT_ID}; cat {BOOT_ID}",
                       user=user)
    assert attempt.stdout.strip() == own and host_id not in attempt.stdout


@USERS
def test_host_ipc_is_not_visible(box: Container, user: str | None) -> None:
    """The host's System V shared memory and POSIX shared memory (/dev/shm) stay out of the sandbox."""
    name = f"rollbox-attack-{secrets.token_hex(6)}"
    shm = Path("/dev/shm") / name
    shm.write_text("host secret")
    made = subprocess.run(["ipcmk", "-M", "4096"], capture_output=True, text=True, check=True)
    segment = made.stdout.split()[-1]
    try:
        result = box.exec(f"ls -A /dev/shm; ipcs -m; cat /dev/shm/{name}", user=user)
        assert name not in result.stdout and "host secret" not in result.stdout, result
        assert f" {segment} " not in f" {result.stdout} ".replace("\n", " "), result
    finally:
        shm.unlink()
        subprocess.run(["ipcrm", "-m", segment], check=False)


@USERS
def test_host_processes_cannot_be_signalled_or_traced(box: Container, neighbour: Neighbour, host: Host,
                                                      runtime_name: str, user: str | None) -> None:
    """kill -9 of host pids by number (and of everything), and ptrace attach, must leave host processes alone."""
    # Run the victim as uid 1000 too: the same uid as the sandbox's user, so only namespaces protect it.
    victim = subprocess.Popen(["sleep", "600"], user=1000, group=1000, extra_groups=[])
    try:
        pids = " ".join(map(str, sorted({victim.pid, os.getpid(), *range(victim.pid - 5, victim.pid + 5)})))
        ptrace = ("python3 -c 'import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                  "for pid in map(int, sys.argv[1:]):\n"
                  f"    print(pid, libc.ptrace(16, pid, 0, 0), ctypes.get_errno())' 1 {pids}")
        result = box.exec(f"{ptrace}; kill -9 {pids}; echo done", user=user)
        attached = [line for line in result.stdout.splitlines()[:-1] if line.split()[1] == "0"]
        assert result.stdout.endswith("done\n") and not attached, result
        # strace, the tool an agent would reach for, fails the same way.
        tools = box.exec(f"strace -p {victim.pid} -e none 2>&1 | head -1; timeout 5 strace -p 1 2>&1 | head -1",
                         user=user)
        assert "attached" not in tools.stdout.lower(), tools
        # Then everything at once. As root this also kills the agent's handler of the very command
        # (same uid), so the call fails; under gVisor, root can even kill the agent (pid 1: gVisor
        # does not shield a namespace's init from its own root), which takes the sandbox down.
        with contextlib.suppress(SandboxNotRunning):
            box.exec("kill -9 -1; kill -9 1", user=user)
        assert victim.poll() is None, "a host process was killed from inside the sandbox"
        assert _tracer(victim.pid) == 0
    finally:
        victim.kill()
        victim.wait()
    host.check()
    neighbour.check()
    assert answers_or_resets(box, runtime_name, may_die=(runtime_name, user) == ("runsc", "root"))


def _tracer(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("TracerPid:")).split()[1])


@USERS
def test_agent_socket_cannot_be_reached_or_replaced(attack_engine: Engine, box: Container, runtime_name: str,
                                                    user: str | None) -> None:
    """The engine's channel to the agent: no command may connect to it, replace it or write beside it.

    Under runc the socket is passed in by fd and has no path inside. Under gVisor it lives in a host
    directory bound into the sandbox: a command that replaced it with its own server would answer
    every later command of the host (forging results), so the agent locks commands out of it.
    """
    forge = """python3 - <<'EOF'
import os, socket, struct
path = '/.rollbox/run/agent.sock'
for attempt in ('connect', 'unlink', 'bind'):
    try:
        if attempt == 'connect':
            socket.socket(socket.AF_UNIX).connect(path)
        elif attempt == 'unlink':
            os.unlink(path)
        else:
            server = socket.socket(socket.AF_UNIX)
            server.bind(path)
            server.listen()
            if os.fork() == 0:
                os.setsid()
                while True:
                    conn, _ = server.accept()
                    conn.recv(65536)
                    conn.sendall(b'o' + struct.pack('>I', 6) + b'forged' + b'z' + struct.pack('>I', 9) + b'0 0 0 0 0')
                    conn.close()
        print(attempt, 'ok')
    except OSError as error:
        print(attempt, error.errno)
EOF"""
    # Under runc /.rollbox/run is an empty directory of the sandbox's own filesystem: binding there
    # is harmless, since the host never connects to it; the agent's socket must be out of reach.
    allowed = {"runc": {"bind ok"}, "runsc": set()}[runtime_name]
    for attempt in (user, "root"):
        result = box.exec(forge, user=attempt)
        assert {line for line in result.stdout.splitlines() if line.endswith(" ok")} <= allowed, result
        check_run_dir(attack_engine, box)
        genuine = box.exec("echo genuine; exit 3")
        assert (genuine.exit_code, genuine.stdout) == (3, "genuine\n"), "a command answered in the agent's place"
        # The lock holds again after a restart of the sandbox over the same socket directory.
        box.reset()


def test_account_lookup_does_not_follow_links_out(box: Container) -> None:
    """exec(user=NAME) looks NAME up in the sandbox's /etc/passwd: root inside must not point that at the host's.

    The lookup runs on the host over the sandbox's layers, and `etc` in the upper can be a link
    (here to /proc/self/root/etc, which on the host is the engine's own /etc): the lookup must
    resolve it inside the sandbox's root, where the host's passwd and group entries are not.
    """
    sandbox_users = {line.split(":")[0] for line in box.exec("cat /etc/passwd").stdout.splitlines()}
    host_only = next(line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()
                     if line and line.split(":")[0] not in sandbox_users)
    box.exec("cp -a /etc /etc.real && rm -rf /etc && ln -s /proc/self/root/etc /etc", user="root")
    with pytest.raises(InvalidRequest):
        box.exec("true", user=host_only)
