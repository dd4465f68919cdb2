"""Runs a task's hidden tests inside the sandbox. Sent as the source of `python3 -`; stdlib only.

The host appends `main(<payload as a Python literal>)`. In order, `main`:
1. kills every process it is allowed to except its own ancestors, so nothing the agent left running
   can touch the tests once they are written;
2. removes `clean` and writes `files` (the hidden tests) over whatever the agent left, or puts back the files
   `patch` touches as the repository's HEAD has them and applies it (`git apply`);
3. runs the `tests` ids with the built-in runner (plain functions and methods of plain classes,
   asserts, `pytest.raises`), or runs `command` and reads pytest's `-rA` summary lines;
4. prints `<nonce> <Python literal>` as its last line: every test id with "passed", "failed" or "missing".
The code under test runs in this process: see "Threat model" in docs/tasks.md for what that allows.
Up front it imports only small modules: json, re and subprocess would add half of the run's CPU
time, so they are imported where needed (the payload and the result are Python literals).
"""

import contextlib
import importlib.util
import io
import os
import signal
import sys

SUMMARY = r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (.+?)(?: - .*)?$"
PASSING = ("PASSED", "XFAIL")


class TestTimeout(BaseException):
    """Raised by the alarm in a test that runs too long; a BaseException so `except Exception` misses it."""


def kill_others():
    protected = {1}
    pid = os.getpid()
    while pid > 1:
        protected.add(pid)
        with open(f"/proc/{pid}/stat") as handle:
            pid = int(handle.read().rsplit(")", 1)[1].split()[1])
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in protected:
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


def remove(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        import shutil

        shutil.rmtree(path)


def place_tests(workdir, clean, files):
    for relative in clean:
        remove(os.path.join(workdir, relative))
    for relative, text in files.items():
        path = os.path.join(workdir, relative)
        remove(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)


def apply_patch(workdir, patch):
    """SWE-bench's way: the files the test patch touches as HEAD has them, then the patch; None, or why it failed."""
    import re
    import subprocess

    paths = sorted({path for pair in re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch, re.M) for path in pair})
    for path in paths:  # a file HEAD lacks is new in the patch: the agent's copy goes
        restored = subprocess.run(["git", "checkout", "-q", "HEAD", "--", path], cwd=workdir, capture_output=True)
        if restored.returncode != 0:
            remove(os.path.join(workdir, path))
    applied = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=workdir, input=patch.encode(),
                             capture_output=True)
    return None if applied.returncode == 0 else "the test patch does not apply: " + applied.stderr.decode()[-2000:]


class Raises:
    """`pytest.raises` for the built-in runner, when pytest is not installed."""

    def __init__(self, expected, match=None):
        self.expected, self.match = expected, match

    def __enter__(self):
        return self

    def __exit__(self, kind, value, _traceback):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False
        import re

        if self.match is not None and not re.search(self.match, str(value)):
            raise AssertionError(f"{value!r} does not match {self.match!r}")
        return True


class PytestShim:
    raises = Raises


def install_pytest_shim():
    try:
        import pytest  # noqa: F401
    except ImportError:
        sys.modules["pytest"] = PytestShim  # type: ignore[assignment]


def load_module(path, number):
    spec = importlib.util.spec_from_file_location(f"_rollbox_test_{number}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def on_alarm(_signum, _frame):
    raise TestTimeout()


def run_one(modules, workdir, test_id, timeout, log):
    path, _, name = test_id.partition("::")
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        if path not in modules:
            modules[path] = load_module(os.path.join(workdir, path), len(modules))
        target = modules[path]
        parts = name.split("::")
        for index, part in enumerate(parts):
            target = getattr(target, part)
            if isinstance(target, type) and index < len(parts) - 1:
                target = target()
        target()
        return "passed"
    except TestTimeout:
        log.append(f"FAILED {test_id} - timed out after {timeout}s")
    except BaseException as error:  # the code under test may raise anything, SystemExit included
        log.append(f"FAILED {test_id} - {type(error).__name__}: {str(error)[:300]}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return "failed"


def run_builtin(workdir, tests, timeout):
    """Runs each test with its output captured, so it cannot print into the result channel."""
    sys.path[:] = [workdir] + [p for p in sys.path if p not in ("", workdir)]
    signal.signal(signal.SIGALRM, on_alarm)
    install_pytest_shim()
    modules, log, outcomes = {}, [], {}
    sys.stdout = sys.stderr = io.StringIO()
    for test_id in tests:
        outcomes[test_id] = run_one(modules, workdir, test_id, timeout, log)
    return outcomes, "\n".join(log)


def run_command(workdir, tests, command):
    import re
    import subprocess

    process = subprocess.run(command, shell=True, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, errors="replace")
    seen = {}
    for line in process.stdout.splitlines():
        match = re.match(SUMMARY, line.strip())
        if match:
            seen[match.group(2)] = "passed" if match.group(1) in PASSING else "failed"
    return {test_id: seen.get(test_id, "missing") for test_id in tests}, process.stdout[-20000:]


def main(payload):
    results = os.fdopen(os.dup(1), "w")
    kill_others()
    workdir = payload["workdir"]
    place_tests(workdir, payload["clean"], payload["files"])
    failed = apply_patch(workdir, payload["patch"]) if payload.get("patch") else None
    if failed:
        outcomes, log = {test_id: "missing" for test_id in payload["tests"]}, failed
    elif payload["command"]:
        outcomes, log = run_command(workdir, payload["tests"], payload["command"])
    else:
        outcomes, log = run_builtin(workdir, payload["tests"], payload["per_test_timeout"])
    results.write("\n" + payload["nonce"] + " " + repr({"outcomes": outcomes, "log": log}) + "\n")
    results.flush()
    os._exit(0)
