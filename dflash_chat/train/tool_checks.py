"""Whether an answer to a tool request is right: the calls the request asked for (one, or two in order), to
those tools, with arguments their schemas accept; whether a request no tool fits is answered in text; whether the answer after a tool's
result quotes it. The calls are read as the app reads them (runtime/tool_calls.py: `parse_calls`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from dflash_chat.runtime.tool_calls import parse_calls
from dflash_chat.train.tool_corpus import ToolChat, result_values

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


class Verdict(NamedTuple):
    """An answer to a request that asks for calls."""

    calls: int  # the calls in the answer
    right_tool: bool  # the calls asked for and no other, to the tools asked for, in order
    valid: bool  # that, and their arguments pass the tools' schemas
    exact: bool  # that, and their arguments are the ones the request named


def schema_errors(parameters: Mapping, args: Mapping) -> list[str]:
    """What is wrong with `args` for the JSON-schema object `parameters`, in the subset tools use: each
    property's `type` (one name) and `enum`, `required`, and no name the properties do not hold."""
    properties = parameters.get("properties") or {}
    errors = [f"missing {name!r}" for name in parameters.get("required") or () if name not in args]
    for name, value in args.items():
        schema = properties.get(name)
        if not isinstance(schema, Mapping):
            errors.append(f"unknown {name!r}")
        elif not _fits(value, schema):
            errors.append(f"{name!r}: {value!r} is not {schema.get('enum') or schema.get('type')}")
    return errors


def _fits(value: Any, schema: Mapping) -> bool:
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        return False
    types = _TYPES.get(schema.get("type", ""), ())
    if not types:
        return True  # a type this subset does not check
    if isinstance(value, bool) and bool not in types:
        return False  # JSON's true is no number
    return isinstance(value, types)


def judge_call(text: str, chat: ToolChat) -> Verdict:
    """The answer `text` to `chat`'s request, which asks for `chat.calls`."""
    assert chat.call is not None, "judge_call reads answers to requests that ask for a call"
    _, calls = parse_calls(text, chat.tools)
    if [c.name for c in calls] != [c.name for c in chat.calls]:
        return Verdict(len(calls), False, False, False)
    valid = exact = True
    for made, asked in zip(calls, chat.calls, strict=True):
        tool = next(t for t in chat.tools if t.name == asked.name)
        try:
            args = made.args()
        except ValueError:
            return Verdict(len(calls), True, False, False)
        valid &= not schema_errors(tool.parameters, args)
        exact &= args == asked.arguments
    return Verdict(len(calls), True, valid, valid and exact)


def answered_in_text(text: str, chat: ToolChat) -> bool:
    """Whether the answer `text` holds text and no call."""
    content, calls = parse_calls(text, chat.tools)
    return not calls and bool(content.strip())


def quotes_result(text: str, chat: ToolChat) -> bool:
    """Whether the answer `text` after `chat`'s tool result is text, no call, that holds each of its values."""
    return answered_in_text(text, chat) and all(value in text for value in result_values(chat.result))
