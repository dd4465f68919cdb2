"""Attacks on privilege: namespaces, mounts, kernel modules, raw sockets, devices, setuid, kernel tunables.

Commands run without capabilities (even as root), with no_new_privs, under a seccomp profile and
with read-only /proc/sys, /sys and cgroupfs. Each test makes the real call (from the shell tools
an agent would use, or from Python or C for the raw syscalls, 32-bit entry points included) and
asserts its concrete failure, then checks the host's side of it where there is one.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from rollbox.engine import Container, Engine
from tests.attacks.attack_support import Host, Neighbour
from tests.support.engines import cgroup_value

USERS = pytest.mark.parametrize("user", [None, "root"], ids=["user", "root"])
ISOLATION = pytest.mark.parametrize("isolated", [False, True], ids=["plain", "isolated"])
"""Isolated commands run where the agent has just made namespaces and mounts: they must get none either."""


def isolation(runtime_name: str, isolated: bool) -> dict[str, bool]:
    if isolated and runtime_name == "runsc":
        pytest.skip("gVisor sandboxes run no isolated commands (tests/test_isolated.py checks the refusal)")
    return {"isolated": isolated}

SYSCALLS = """python3 - <<'EOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, number, *args):
    result = libc.syscall(number, *args)
    if result == 0 and name.startswith("clone"):
        os._exit(0)  # a child made it: report from the parent only
    print(name, "OK" if result >= 0 else f"errno {ctypes.get_errno()}")
flags = {"user": 0x10000000, "mount": 0x00020000, "net": 0x40000000, "pid": 0x20000000, "ipc": 0x08000000,
         "uts": 0x04000000, "cgroup": 0x02000000}
for kind, flag in flags.items():
    call(f"unshare-{kind}", 272, flag)
    call(f"clone-{kind}", 56, flag | 17, 0, 0, 0, 0)
args = (ctypes.c_uint64 * 11)(0x10000000 | 0x00020000, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
call("clone3-user", 435, ctypes.byref(args), ctypes.sizeof(args))
call("setns", 308, os.open("/proc/self/ns/net", os.O_RDONLY), 0)
call("mount", 165, b"none", b"/mnt", b"tmpfs", 0, 0)
call("umount2", 166, b"/proc", 2)
call("fsopen", 430, b"tmpfs", 0)
call("open_tree", 428, -100, b"/", 1)
call("pivot_root", 155, b"/tmp", b"/tmp")
call("chroot", 161, b"/tmp")
call("init_module", 175, b"\\0" * 64, 64, b"")
call("finit_module", 313, os.open("/dev/null", os.O_RDONLY), b"", 0)
call("delete_module", 176, b"ext4", 0)
call("kexec_load", 246, 0, 0, 0, 0)
call("bpf", 321, 0, 0, 0)
call("perf_event_open", 298, 0, 0, -1, -1, 0)
call("userfaultfd", 323, 0)
call("io_uring_setup", 425, 8, (ctypes.c_uint8 * 120)())
call("keyctl", 250, 0, 0)
call("reboot", 169, 0xfee1dead, 672274793, 0x4321fedc, 0)
call("swapon", 167, b"/tmp/swap", 0)
call("sethostname", 170, b"evil", 4)
call("settimeofday", 164, (ctypes.c_long * 2)(0, 0), 0)
call("iopl", 172, 3)
call("ioperm", 173, 0, 1024, 1)
EOF"""
EXPECTED_DENIED = ["unshare-user", "unshare-mount", "unshare-net", "unshare-pid", "unshare-ipc", "unshare-uts",
                   "unshare-cgroup", "clone-user", "clone-mount", "clone-net", "clone-pid", "clone-ipc",
                   "clone-uts", "clone-cgroup", "clone3-user", "setns", "mount", "umount2", "fsopen", "open_tree",
                   "pivot_root", "chroot", "init_module", "finit_module", "delete_module", "kexec_load", "bpf",
                   "perf_event_open", "userfaultfd", "io_uring_setup", "keyctl", "reboot", "swapon", "sethostname",
                   "settimeofday", "iopl", "ioperm"]


@ISOLATION
@USERS
def test_privileged_syscalls_fail(box: Container, neighbour: Neighbour, host: Host, user: str | None,
                                  runtime_name: str, isolated: bool) -> None:
    """New namespaces (user namespaces above all), mounts, modules, kexec, bpf and the rest: every one fails."""
    mode = isolation(runtime_name, isolated)
    mounts = box.exec("cat /proc/self/mountinfo").stdout
    result = box.exec(SYSCALLS, user=user, timeout=60, **mode)
    outcome = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert sorted(outcome) == sorted(EXPECTED_DENIED), result
    allowed = {name: value for name, value in outcome.items() if not value.startswith("errno")}
    assert not allowed, f"privileged calls succeeded: {allowed}"
    assert box.exec("cat /proc/self/mountinfo").stdout == mounts
    # The command-line tools fail the same way.
    tools = box.exec("unshare -Ur true; unshare -m true; unshare -n true; mount -t tmpfs none /mnt; "
                     "mount --bind / /mnt; umount -l /usr/bin; umount /proc; chroot / true; "
                     "modprobe -q dummy; hostname evil; dmesg; echo end", user=user, timeout=60, **mode)
    assert tools.stdout == "end\n" and box.exec("hostname").stdout == "sandbox\n", tools
    host.check()
    neighbour.check()


I386_AND_X32 = r"""cat > /tmp/legacy.c <<'EOF'
#include <stdio.h>
/* The 32-bit (int 0x80) and x32 entry points have their own syscall numbers: the filter must cover them. */
static long i386(long nr, long a1, long a2) {
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(nr), "b"(a1), "c"(a2) : "memory");
    return ret;
}
static long x32(long nr, long a1) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a1) : "rcx", "r11", "memory");
    return ret;
}
int main(void) {
    printf("i386-unshare %ld\n", i386(310, 0x10000000, 0));
    printf("i386-clone %ld\n", i386(120, 0x10000000 | 17, 0));
    printf("i386-mount %ld\n", i386(21, 0, 0));
    printf("x32-unshare %ld\n", x32(0x40000000 | 272, 0x10000000));
    return 0;
}
EOF
gcc -O1 -o /tmp/legacy /tmp/legacy.c && /tmp/legacy"""


@ISOLATION
@USERS
def test_legacy_syscall_entry_points_are_filtered(box: Container, user: str | None, runtime_name: str,
                                                  isolated: bool) -> None:
    """unshare(CLONE_NEWUSER) and mount through the i386 (int 0x80) and x32 ABIs must fail like the 64-bit ones."""
    result = box.exec(I386_AND_X32.replace("/tmp/legacy", f"/tmp/legacy-{user}"), user=user, timeout=120,
                      **isolation(runtime_name, isolated))
    values = dict(line.split() for line in result.stdout.splitlines())
    assert set(values) == {"i386-unshare", "i386-clone", "i386-mount", "x32-unshare"}, result
    assert all(int(value) < 0 for value in values.values()), f"a legacy entry point got through: {values}"


@USERS
def test_raw_sockets_fail(box: Container, user: str | None) -> None:
    """Packet and raw IP sockets (sniffing, spoofing) need CAP_NET_RAW, which no command has."""
    probe = """python3 - <<'EOF'
import socket
for name, args in (("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0)),
                   ("packet-dgram", (socket.AF_PACKET, socket.SOCK_DGRAM, 0)),
                   ("raw-icmp", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                   ("raw-tcp", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)),
                   ("raw6", (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6))):
    try:
        socket.socket(*args).close()
        print(name, "OPEN")
    except OSError as error:
        print(name, "errno", error.errno)
EOF"""
    result = box.exec(probe, user=user)
    assert result.stdout.count("errno") == 5 and "OPEN" not in result.stdout, result


@USERS
def test_device_nodes(attack_engine: Engine, box: Container, runtime_name: str, user: str | None) -> None:
    """No device node can be made, the host's disk and memory devices are absent, the devices cgroup denies all."""
    disk = os.stat("/").st_dev
    major, minor = os.major(disk), os.minor(disk)
    result = box.exec(f"mknod /tmp/disk-$$ b {major} {minor}; echo mknod=$?; mknod /tmp/mem-$$ c 1 1; "
                      "echo mknod=$?; python3 -c \"import os; os.mknod('/tmp/kmsg', 0o20600, os.makedev(1, 11))\" "
                      "2>/dev/null; echo mknod=$?; ls /dev", user=user)
    lines = result.stdout.splitlines()
    assert lines[:3] == ["mknod=1", "mknod=1", "mknod=1"], result
    present = set(lines[3:])
    allowed = {"core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
               "tty", "urandom", "zero"} | ({"fuse", "net"} if runtime_name == "runsc" else set())
    assert present <= allowed, f"unexpected devices: {present - allowed}"
    opened = box.exec("for d in /dev/mem /dev/kmem /dev/port /dev/sda /dev/vda /dev/kmsg /dev/console; do "
                      "head -c1 $d >/dev/null 2>&1 && echo OPENED $d; done; echo end", user=user)
    assert opened.stdout == "end\n", opened
    if runtime_name == "runc":  # gVisor enforces devices itself; runc relies on the devices cgroup
        # Only the listed character devices may be read or written ("m" alone only allows mknod,
        # which needs CAP_MKNOD anyway).
        rules = [rule.split() for rule in cgroup_value(attack_engine, box, "devices", "devices.list").splitlines()]
        granted = [f"{kind} {numbers}" for kind, numbers, access in rules if set(access) & set("rw")]
        allowed_numbers = {"c 1:3", "c 1:5", "c 1:7", "c 1:8", "c 1:9", "c 5:0", "c 5:1", "c 5:2", "c 136:*",
                           "c 10:200"}
        assert set(granted) <= allowed_numbers, granted


SETUID_PROBE = r"""cat > /tmp/euid.c <<'EOF'
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
/* Preloaded into a setuid program: prints the identity the program really got, then stops it. If the
 * kernel honoured the setuid bit, the loader would run in secure mode and ignore this library. */
__attribute__((constructor)) static void report(void) {
    printf("euid=%d\n", (int)geteuid());
    fflush(stdout);
    _exit(0);
}
EOF
gcc -shared -fPIC -o /tmp/euid.so /tmp/euid.c || exit 9
for program in /usr/bin/su /usr/bin/passwd /usr/bin/mount /usr/bin/umount /usr/bin/chsh /usr/bin/chfn \
               /usr/bin/gpasswd /usr/bin/newgrp; do
    test -u $program || continue
    printf '%s ' $program; LD_PRELOAD=/tmp/euid.so $program </dev/null 2>&1 | head -1
done"""


def test_setuid_programs_grant_nothing(box: Container) -> None:
    """The host's setuid-root programs (su, passwd, mount...) run with the caller's uid, not root's."""
    result = box.exec(SETUID_PROBE, timeout=120)
    lines = result.stdout.splitlines()
    assert len(lines) >= 3, f"too few setuid programs to attack: {result}"
    assert all(line.endswith(" euid=1000") for line in lines), result
    su = box.exec("su -c 'id -u' root </dev/null; echo rc=$?")
    assert "rc=0" not in su.stdout and not su.stdout.startswith("0"), su


def test_setuid_copy_grants_nothing_inside_or_on_the_host(attack_engine: Engine, box: Container, host: Host,
                                                         runtime_name: str) -> None:
    """Root inside makes a setuid-root copy of `id`: it must grant root neither inside nor on the host.

    On the host the file sits in the sandbox's root filesystem: a host user who can reach the path
    (an fd is enough) must not get root by running it either.
    """
    made = box.exec("cp /usr/bin/id /tmp/rootid && chmod 6755 /tmp/rootid && stat -c '%a %U' /tmp/rootid",
                    user="root")
    assert made.stdout == "6755 root\n", made
    assert box.exec("/tmp/rootid -u; /tmp/rootid -g").stdout == "1000\n1000\n"
    # File capabilities need CAP_SETFCAP.
    setcap = box.exec("python3 -c \"import os; os.setxattr('/tmp/rootid', 'security.capability', "
                      "bytes.fromhex('0000000200000000ffffffff0000000000000000'))\"", user="root")
    assert setcap.exit_code != 0, setcap
    copy = attack_engine.launcher.rootfs(box.id) / "tmp" / "rootid"
    assert copy.stat().st_mode & 0o6000 == 0o6000 and copy.stat().st_uid == 0
    fd = os.open(copy, os.O_PATH)
    try:
        nobody = subprocess.run([f"/proc/self/fd/{fd}", "-u"], pass_fds=[fd], user=65534, group=65534,
                                extra_groups=[], capture_output=True, text=True, check=False)
    except OSError as error:  # gVisor's gofer may still hold the copy open for writing
        assert error.errno == errno.ETXTBSY and runtime_name == "runsc", error
        assert os.statvfs(copy).f_flag & os.ST_NOSUID, "the setuid copy would run as root on the host"
    else:
        assert nobody.stdout == "65534\n", f"a host user ran the sandbox's setuid copy as {nobody.stdout!r}"
    finally:
        os.close(fd)
    host.check()


@pytest.mark.parametrize("user", [None, "root"], ids=["user", "root"])
def test_kernel_tunables_and_cgroups_are_read_only(attack_engine: Engine, box: Container, neighbour: Neighbour,
                                                   host: Host, runtime_name: str, user: str | None) -> None:
    """Writes to /proc/sys, /proc/sysrq-trigger, /sys and the sandbox's own cgroup limits must all fail."""
    limits = {(controller, name): cgroup_value(attack_engine, box, controller, name)
              for controller, name in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max"),
                                       ("cpu", "cpu.cfs_quota_us"), ("freezer", "freezer.state"))}
    targets = {
        "/proc/sys/kernel/core_pattern": "|/tmp/pwn", "/proc/sys/kernel/sysrq": "1",
        "/proc/sys/vm/drop_caches": "3", "/proc/sysrq-trigger": "h", "/proc/sys/kernel/modprobe": "/tmp/pwn",
        "/proc/sys/fs/binfmt_misc/register": ":pwn:E::pwn::/tmp/pwn:", "/sys/kernel/uevent_helper": "/tmp/pwn",
        "/sys/class/net/lo/mtu": "1280", "/sys/fs/cgroup/memory/memory.limit_in_bytes": "-1",
        "/sys/fs/cgroup/pids/pids.max": "max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1",
        "/sys/fs/cgroup/freezer/freezer.state": "FROZEN", "/sys/fs/cgroup/memory/release_agent": "/tmp/pwn",
        "/sys/fs/cgroup/memory/notify_on_release": "1", "/sys/fs/cgroup/memory/cgroup.procs": "1",
    }
    if runtime_name == "runc":
        # A command must not shield itself from the OOM killer (so that the agent would die first).
        # (gVisor has no per-process OOM victims: a breach kills the whole sandbox.)
        targets["/proc/self/oom_score_adj"] = "-1000"
    script = "; ".join(f"(printf '%s' '{value}' > {path}) 2>/dev/null && echo 'WROTE {path}'"
                       for path, value in targets.items())
    result = box.exec(f"{script}; echo end", user=user)
    assert result.stdout == "end\n", result
    after = {key: cgroup_value(attack_engine, box, *key) for key in limits}
    assert after == limits, "the sandbox changed its own cgroup limits"
    host.check()  # core_pattern and sysrq are among the host files it hashes
    neighbour.check()
    assert box.exec("echo alive").stdout == "alive\n"


def test_host_side_root_filesystem_is_nosuid_nodev(attack_engine: Engine, box: Container) -> None:
    """From the host, the sandbox's root filesystem must not honour setuid bits or device nodes."""
    flags = os.statvfs(attack_engine.launcher.rootfs(box.id)).f_flag
    assert flags & os.ST_NOSUID and flags & os.ST_NODEV
    assert Path(attack_engine.launcher.rootfs(box.id) / "etc" / "passwd").is_file()
