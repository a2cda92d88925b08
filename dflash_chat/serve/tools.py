"""The tools a request offers, checked: their names and schemas, and the choice among them.

Each dialect reads its own shapes into ToolSpecs and one ToolUse here, so a wrong tool is refused the
same way whichever route it came by: a 400 that names the field. serve never runs a tool: it renders the
tools into the prompt and returns the model's calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping

from dflash_chat.engine.rules import shown
from dflash_chat.runtime.tool_calls import ToolSpec
from dflash_chat.runtime.tool_use import CHOICES, ToolUse
from dflash_chat.serve.errors import bad_request

NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_TOOLS = 256


def spec(name, description, parameters, where: str) -> ToolSpec:
    """One tool from its name, description and JSON-schema parameters (`where`: the field it came from)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad_request(
            f"'{where}.name' must be 1 to 128 letters, digits, '_', '-', '.' or ':'; got {shown(name)}.",
            f"{where}.name",
        )
    if description is not None and not isinstance(description, str):
        raise bad_request(f"'{where}.description' must be a string.", f"{where}.description")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
        raise bad_request(f"'{where}' parameters must be a JSON schema of type 'object'.", where)
    properties = parameters.get("properties", {})
    if not isinstance(properties, Mapping) or not all(isinstance(p, Mapping) for p in properties.values()):
        raise bad_request(f"'{where}' parameters' 'properties' must map names to JSON schemas.", where)
    return ToolSpec(name, description or "", dict(parameters))


def specs(
    body: Mapping, shape: str, read: Callable[[object, str], ToolSpec | None], *, refuse_others: bool = True
) -> list[ToolSpec]:
    """The request's `tools` list, each item read by the dialect's `read(item, where)`; `shape` says what the list
    must hold. A tool the dialect's read gives None for is one its own servers run (a web search, a file search):
    nothing here runs it, so the request is refused with every such tool named (`refuse_others`), or, for a
    dialect whose clients send them with every request (Codex's Responses requests), the tool is left out of the
    prompt and of the tools the answer says it took."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad_request(f"'tools' must be a list of {shape}.", "tools")
    read_ = [read(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    others = [
        f"{_kind(tool)} (tools[{i}])" for i, (tool, spec) in enumerate(zip(tools, read_, strict=True)) if spec is None
    ]
    if others and refuse_others:
        raise bad_request(
            f"'tools' holds {', '.join(others)}, which this server does not run: it takes only {shape}, which "
            "the client runs itself. Remove the others from 'tools'.",
            "tools",
            "unsupported_tool",
        )
    return [tool for tool in read_ if tool is not None]


def _kind(tool: Mapping) -> str:
    """A tool's type as its dialect names it, with its name when it has one."""
    kind, name = tool.get("type"), tool.get("name")
    said = kind if isinstance(kind, str) else "a tool of no type"
    return f"{said} {name!r}" if isinstance(name, str) and name != kind else said


def openai_choice(choice, named: Callable[[Mapping], object], shape: str):
    """OpenAI's `tool_choice`: "auto", "none", "required", or a function object whose name `named` reads
    (`shape` shows that object in the error); the name, or the word, or None when absent."""
    if isinstance(choice, Mapping):
        name = named(choice) if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise bad_request(f"'tool_choice' must be auto, none, required or {shape}.", "tool_choice")
        return name
    if choice is not None and choice not in ("auto", "none", "required"):
        raise bad_request(
            f"'tool_choice' must be auto, none, required or a named function; got {shown(choice)}.", "tool_choice"
        )
    return choice


def tool_use(tools: list[ToolSpec], choice, parallel, field: str = "tool_choice") -> ToolUse | None:
    """The ToolUse of a request: `choice` is "auto", "none", "required" or a tool's name (None: auto when there
    are tools); `parallel` whether several calls may come in one answer. None when no tools are offered."""
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"'tools' may hold at most {MAX_TOOLS} tools.", "tools")
    names = [tool.name for tool in tools]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:
        raise bad_request(f"'tools' names the tool {repeated!r} twice.", "tools")
    if not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be true or false.", "parallel_tool_calls")
    choice = choice if choice is not None else "auto"
    if choice not in CHOICES and choice not in names:
        known = ", ".join(names) if names else "none: the request offers no tools"
        raise bad_request(f"'{field}' names {shown(choice)}, which is not among the tools ({known}).", field)
    if choice == "required" and not tools:
        raise bad_request(f"'{field}' is 'required' but the request offers no tools.", field)
    return ToolUse(tuple(tools), choice, parallel) if tools else None


def arguments(value, where: str) -> dict:
    """A call's arguments as a mapping: a JSON object, or its text (as OpenAI sends them)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise bad_request(f"'{where}' must be a JSON object (as text); it does not parse.", where) from None
    if not isinstance(value, Mapping):
        raise bad_request(f"'{where}' must be a JSON object.", where)
    return dict(value)
