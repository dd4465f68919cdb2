"""Actions are tool calls: bash, read_file, write_file, str_replace and submit.

A policy may return an action model, a dict `{"tool": "bash", "command": "ls"}`, the same as JSON
text, or an OpenAI-style function call `{"name": "bash", "arguments": {...}}` (arguments as a dict
or JSON text), so an LLM's tool call plugs in unchanged. `TOOLS` holds the matching schemas.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from rollbox._problems import problems
from rollbox.errors import InvalidAction


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Bash(_Action):
    """Run a shell command in the repository directory."""

    tool: Literal["bash"] = "bash"
    command: str = Field(description="The shell command to run (under /bin/sh -c).")
    timeout: float | None = Field(None, description="Seconds before the command is killed.", gt=0)


class ReadFile(_Action):
    """Read a file."""

    tool: Literal["read_file"] = "read_file"
    path: str = Field(description="Path of the file, relative to the repository directory or absolute.")


class WriteFile(_Action):
    """Create or overwrite a file."""

    tool: Literal["write_file"] = "write_file"
    path: str = Field(description="Path of the file, relative to the repository directory or absolute.")
    content: str = Field(description="The file's new content.")


class StrReplace(_Action):
    """Replace the one occurrence of `old` in a file with `new`."""

    tool: Literal["str_replace"] = "str_replace"
    path: str = Field(description="Path of the file, relative to the repository directory or absolute.")
    old: str = Field(description="The exact text to replace; it must occur exactly once in the file.")
    new: str = Field(description="The text to put in its place.")


class Submit(_Action):
    """Finish the episode: the hidden tests run and decide the reward."""

    tool: Literal["submit"] = "submit"


Action = Annotated[Bash | ReadFile | WriteFile | StrReplace | Submit, Field(discriminator="tool")]
ACTION_TYPES: tuple[type[_Action], ...] = (Bash, ReadFile, WriteFile, StrReplace, Submit)
_ADAPTER: TypeAdapter[Action] = TypeAdapter(Action)


def parse_action(raw: Any) -> Action:
    """Turns any accepted action shape into an action model."""
    if isinstance(raw, ACTION_TYPES):
        return raw  # type: ignore[return-value]
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            raise InvalidAction(f"the action is not JSON ({error}); send e.g. "
                                '{"tool": "bash", "command": "ls"}') from None
    if isinstance(raw, Mapping) and "name" in raw and "tool" not in raw:
        arguments = raw.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as error:
                raise InvalidAction(f"the arguments of {raw['name']!r} are not JSON: {error}") from None
        raw = {"tool": raw["name"], **arguments}
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as error:
        raise InvalidAction(f"not a valid tool call ({problems(error, 'action')}); tools: "
                            f"{', '.join(t.model_fields['tool'].default for t in ACTION_TYPES)}") from None


def action_dict(action: Action) -> dict[str, Any]:
    """The canonical form stored in trajectories."""
    return action.model_dump(exclude_none=True)


def _schema(model: type[_Action]) -> dict[str, Any]:
    schema = model.model_json_schema()
    properties = {name: {k: v for k, v in spec.items() if k in ("type", "description")}
                  for name, spec in schema["properties"].items() if name != "tool"}
    for spec in properties.values():
        spec.setdefault("type", "number")  # `float | None` has no single type: the tool takes a number
    return {"type": "function", "function": {
        "name": model.model_fields["tool"].default, "description": (model.__doc__ or "").strip(),
        "parameters": {"type": "object", "properties": properties,
                       "required": [n for n in schema.get("required", []) if n != "tool"]}}}


TOOLS: list[dict[str, Any]] = [_schema(model) for model in ACTION_TYPES]
"""OpenAI function-calling schemas of the tools."""
