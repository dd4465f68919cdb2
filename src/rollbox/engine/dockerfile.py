"""Dockerfiles, parsed by Docker's own parser (the `dockerfile` package) into a build plan (engine/plan.py).

Every instruction the builder cannot honour is refused here, before anything is built, with its line and what to
write instead (docs/dockerfile.md). Words are expanded later, stage by stage, with BuildKit's own shell lexer
(`e2b-dockerfile-utils`, a port of it), once the builder knows the base image's environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import dockerfile
from e2b_dockerfile_utils import ShellLex

from rollbox.engine.plan import Arg, Copy, Env, Op, Plan, Record, Run, Shell, Stage, User, Workdir
from rollbox.errors import InvalidResource

_ESCAPE_DIRECTIVE = re.compile(r"^#\s*escape\s*=\s*(\S)\s*$", re.IGNORECASE)
_DIRECTIVE = re.compile(r"^#\s*[a-z]+\s*=", re.IGNORECASE)
_REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|git@)", re.IGNORECASE)
_STAGE_NAME = re.compile(r"^[a-z][a-z0-9._-]*$")
_CHMOD = re.compile(r"^[0-7]{3,4}$")
_RECORDED = {"CMD": "cmd", "ENTRYPOINT": "entrypoint", "HEALTHCHECK": "healthcheck", "STOPSIGNAL": "stopSignal",
             "EXPOSE": "exposedPorts", "VOLUME": "volumes", "LABEL": "labels", "MAINTAINER": "labels"}
_REFUSED_FLAGS = {
    "--mount": "a build container has no mounts: COPY what the command needs first",
    "--network": "build containers use the host's network: drop the flag",
    "--security": "build containers run with the same restrictions as sandboxes: drop the flag",
    "--device": "build containers get no devices: drop the flag",
    "--link": "drop --link: the files are copied into the image as it is",
    "--exclude": "drop --exclude and list what to copy, or add the paths to .dockerignore",
    "--parents": "drop --parents and give each destination",
    "--checksum": "ADD fetches nothing: drop --checksum",
    "--keep-git-dir": "ADD fetches nothing: drop --keep-git-dir",
    "--unpack": "drop --unpack: ADD unpacks a local tar archive, and COPY copies it as it is",
    "--platform": "images are built for this machine's platform: drop --platform",
}
_ALLOWED_FLAGS = {"COPY": ("--chown", "--chmod", "--from"), "ADD": ("--chown", "--chmod"),
                  "HEALTHCHECK": ("--interval", "--timeout", "--start-period", "--start-interval", "--retries")}


def parse(text: str, target: str | None = None) -> Plan:
    """The plan of a Dockerfile; raises InvalidResource naming the line of the first instruction refused."""
    try:
        commands = dockerfile.parse_string(text)
    except dockerfile.GoParseError as error:
        raise InvalidResource(f"the Dockerfile does not parse: {error}") from None
    escape = _escape(text)
    stages: list[Stage] = []
    global_args: list[Arg] = []
    for command in commands:
        line, name = command.start_line, command.cmd.upper()
        _check_flags(command, line)
        if name == "FROM":
            stages.append(_stage(command, stages))
        elif name == "ARG" and not stages:
            global_args.extend(_args(command, line))
        elif not stages:
            raise InvalidResource(f"Dockerfile line {line}: {name} comes before the first FROM: only ARG may")
        else:
            stages[-1].ops.extend(_ops(command, name, line))
    if not stages:
        raise InvalidResource("the Dockerfile has no FROM: start it with FROM <image> (or FROM scratch)")
    return Plan(stages, _target(stages, target), global_args, escape)


def expand(word: str, variables: Mapping[str, str], escape: str | None, words: bool = False) -> str | list[str]:
    """A word (or, with `words`, a line of words) with its variables expanded and its quotes removed, as Docker
    does; an unset variable expands to nothing. A plan made from YAML steps (`escape` None) expands nothing."""
    if escape is None:
        return word.split() if words else word
    lexer = ShellLex(escape, env=dict(variables), skip_unset_env=False)
    try:
        return lexer.process_words(word) if words else lexer.process_word(word)
    except ValueError as error:
        raise InvalidResource(f"cannot expand {word!r}: {error}") from None


def _escape(text: str) -> str:
    """The escape character a parser directive sets (`# escape=``), else a backslash."""
    for line in text.splitlines():
        match = _ESCAPE_DIRECTIVE.match(line.strip())
        if match:
            return match.group(1)
        if not _DIRECTIVE.match(line.strip()):
            break
    return "\\"


def _check_flags(command: dockerfile.Command, line: int) -> None:
    name = command.cmd.upper()
    for flag in command.flags:
        key = flag.split("=", 1)[0].lower()
        if key in _ALLOWED_FLAGS.get(name, ()):
            continue
        hint = _REFUSED_FLAGS.get(key, "drop it")
        raise InvalidResource(f"Dockerfile line {line}: {name} {key} is not supported: {hint}")


def _stage(command: dockerfile.Command, stages: list[Stage]) -> Stage:
    line, value = command.start_line, command.value
    if len(value) == 1:
        name = None
    elif len(value) == 3 and value[1].upper() == "AS":
        name = value[2].lower()
        if not _STAGE_NAME.match(name):
            raise InvalidResource(f"Dockerfile line {line}: stage name {value[2]!r} must start with a letter and "
                                  "hold only letters, digits, '.', '_' and '-'")
        if any(stage.name == name for stage in stages):
            raise InvalidResource(f"Dockerfile line {line}: a stage named {name!r} comes earlier: name it otherwise")
    else:
        raise InvalidResource(f"Dockerfile line {line}: write FROM <image> [AS <name>]")
    return Stage(value[0], name, line)


def _target(stages: list[Stage], target: str | None) -> int:
    if target is None:
        return len(stages) - 1
    for index, stage in enumerate(stages):
        if stage.name == target.lower():
            return index
    named = ", ".join(stage.name for stage in stages if stage.name) or "none"
    raise InvalidResource(f"target {target!r} is no stage of the Dockerfile (its named stages: {named})")


def _args(command: dockerfile.Command, line: int) -> list[Arg]:
    if not command.value:
        raise InvalidResource(f"Dockerfile line {line}: write ARG <name>[=<default>]")
    args = []
    for item in command.value:
        name, equals, default = item.partition("=")
        args.append(Arg(name, default if equals else None, line=line))
    return args


def _ops(command: dockerfile.Command, name: str, line: int) -> list[Op]:
    value = list(command.value)
    if name == "RUN":
        return [_run(command, line)]
    if name in ("COPY", "ADD"):
        return [_copy(command, name, line)]
    if name == "ARG":
        return list(_args(command, line))
    if name == "ONBUILD":
        raise InvalidResource(f"Dockerfile line {line}: ONBUILD is not supported: put the instructions in the "
                              "Dockerfiles that build on this one")
    if name not in ("ENV", "WORKDIR", "USER", "SHELL", *_RECORDED):
        raise InvalidResource(f"Dockerfile line {line}: {command.cmd} is not an instruction rollbox builds "
                              "(see docs/dockerfile.md)")
    if not value or not any(value):
        raise InvalidResource(f"Dockerfile line {line}: {name} needs a value")
    if name == "ENV":
        return [Env(list(zip(value[::2], value[1::2], strict=True)), line=line)]
    if name == "WORKDIR":
        return [Workdir(value[0], line=line)]
    if name == "USER":
        return [User(value[0], line=line)]
    if name == "SHELL":
        if not command.json:
            raise InvalidResource(f'Dockerfile line {line}: SHELL in its JSON form only: SHELL ["/bin/bash", "-c"]')
        return [Shell(value, line=line)]
    return [_record(command, name, value, line)]


def _run(command: dockerfile.Command, line: int) -> Run:
    if command.heredocs:
        name = command.heredocs[0].name
        if len(command.heredocs) != 1 or command.value not in ((f"<<{name}",), (f"<<-{name}",)):
            raise InvalidResource(f"Dockerfile line {line}: this heredoc is not supported: of the heredoc forms only "
                                  "`RUN <<EOF` (the script alone) is; put the commands in one, or COPY a script")
        return Run(command.heredocs[0].content, line=line)
    if not command.value or not any(command.value):
        raise InvalidResource(f"Dockerfile line {line}: RUN needs a command")
    return Run(list(command.value) if command.json else command.value[0], line=line)


def _copy(command: dockerfile.Command, name: str, line: int) -> Copy:
    if command.heredocs:
        raise InvalidResource(f"Dockerfile line {line}: {name} <<EOF is not supported: put the file in the build "
                              "context and COPY it, or write it with RUN")
    if len(command.value) < 2:
        raise InvalidResource(f"Dockerfile line {line}: write {name} <source>... <destination>")
    flags = dict(flag[2:].split("=", 1) if "=" in flag else (flag[2:], "") for flag in command.flags)
    sources, dest = list(command.value[:-1]), command.value[-1]
    if name == "ADD":
        remote = next((source for source in sources if _REMOTE.match(source)), None)
        if remote is not None:
            raise InvalidResource(f"Dockerfile line {line}: ADD of a URL ({remote}) is not supported: builds fetch "
                                  "nothing themselves; download it into the build context and COPY it, or fetch it "
                                  "with RUN (curl, git clone)")
    mode = flags.get("chmod")
    if mode is not None and not _CHMOD.match(mode):
        raise InvalidResource(f"Dockerfile line {line}: --chmod={mode}: give octal permissions such as 0644")
    if len(sources) > 1 and not dest.endswith("/"):
        raise InvalidResource(f"Dockerfile line {line}: {name} of several sources needs a destination directory "
                              f"ending in '/' ({dest}/)")
    return Copy(sources, dest, owner=flags.get("chown") or None, mode=mode, source=flags.get("from") or None,
                extract=name == "ADD", line=line)


def _record(command: dockerfile.Command, name: str, value: list[str], line: int) -> Record:
    key = _RECORDED[name]
    if name in ("CMD", "ENTRYPOINT"):
        return Record(key, value if command.json else ["/bin/sh", "-c", value[0]], line=line)
    if name == "HEALTHCHECK":
        return Record(key, {"test": value, "options": list(command.flags)}, line=line)
    if name == "MAINTAINER":
        return Record(key, [("maintainer", value[0])], line=line)
    if name == "LABEL":
        return Record(key, list(zip(value[::2], value[1::2], strict=True)), line=line, expand=True)
    return Record(key, value, line=line, expand=True)
