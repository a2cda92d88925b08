"""The tool calls Qwen3.6/3.8 write, read out of the answer text: for `serve` (OpenAI's `tool_calls`) and
One file past 500 lines: the writer and the streamed and whole-text readers share one grammar of a call.
the chat app's agent loop. Pure Python and json, so the UI and serve import it before anything loads.

The models write a call in the Qwen3-Coder form (`render_call` writes one the same way):

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

and sometimes the older Hermes form, a JSON object inside the same tags:
`<tool_call>{"name": NAME, "arguments": {...}}</tool_call>` (`arguments` may also be a JSON text). Several
calls may follow each other, with whitespace between them.

How the text is read:
- A value is the text between `<parameter=ARG>` and its `</parameter>`, less exactly one leading and one
  trailing newline (the format's own; a model that writes a space or a tab there instead has it taken as the
  format's too, as the call grammar reads it, engine/constraint.py); the rest is kept as written: no unescaping (`&amp;` stays as is),
  lines and indentation whole. The `</parameter>` that ends a value is the first one followed, after
  whitespace, by `<parameter=`, `</function>` or `</tool_call>`; so code that holds `</parameter>` or
  `</tool_call>` as text does not end the value or the call early.
- Values are text; each is converted by the tool's JSON schema (`parameters.properties[ARG]`): integer,
  number, boolean, null, object, array, a `type` list and `anyOf`/`oneOf` (each tried in order, string
  last), `enum` (the member's own type). A value that does not convert, or a parameter the schema does not
  name, stays the string: conversion never fails a call.
- A Hermes call's arguments are taken as the model typed them (they are JSON already).
- Only a whole, well-formed block is a call. A block that breaks the form stays in the content verbatim,
  as does one that names a tool not among `tools` (any name is a call when `tools` is empty), and one
  still open when the text ends.
- Text between `<think>` and `</think>` is never parsed: a call written while thinking is not a call.
  Callers hand over the answer alone (after the thinking split), so this only guards against a think
  block that reaches this far.

The content is the text outside the calls, less the whitespace that follows each call and the trailing
whitespace of the whole. `CallStream` reads a streamed answer with the same rules and the same result for
any split of the text: content up to a call goes out at once, except what may be the start of a tag
(held until the next piece says what it is) and trailing whitespace; a call block is held until it
closes, then comes out as one ToolCall (or as its text, when it is not a call).

A forced call: the assistant's turn is opened with `call_opening(name)` in the prompt, and the model goes
on from there. Its calls are those of `opening + generated` (`parse_forced`); a stream is fed the opening
first (it comes out with what follows).
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_FUNC, _FUNC_END = "<function=", "</function>"
_PARAM, _PARAM_END = "<parameter=", "</parameter>"
_THINK, _THINK_END = "<think>", "</think>"

_EDGE = ("\n", " ", "\t", "\r")  # one of these at each end of a value is the format's (as the call grammar has it)
_MAX_NAME = 256  # a function or parameter name longer than this is not one (so garbage is not held long)
_BAD_NAME = set("<>{}\"'") | {" ", "\t", "\n", "\r"}
_INT = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_TYPE_NAMES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
}


@dataclass(frozen=True)
class ToolSpec:
    """A function tool: its name, what it does, and its parameters as a JSON-schema object."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=dict)

    def as_openai(self) -> dict:
        """OpenAI's shape (what chat templates take as `tools=`)."""
        function: dict = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    @staticmethod
    def of_openai(item: Mapping) -> ToolSpec:
        """A tool from OpenAI's shape (`{"type": "function", "function": {...}}`, or the function alone).
        Only the shape is checked (ValueError): callers check names and schemas their own way."""
        function = item.get("function", item)
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError("a tool is {'type': 'function', 'function': {'name': ..., ...}}")
        description = function.get("description") or ""
        parameters = function.get("parameters") or {}
        if not isinstance(description, str) or not isinstance(parameters, Mapping):
            raise ValueError(f"tool {function['name']!r}: 'description' must be text, 'parameters' an object")
        return ToolSpec(function["name"], description, dict(parameters))


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: `arguments` is a JSON object's text, as OpenAI's API carries it."""

    id: str
    name: str
    arguments: str

    def args(self) -> dict:
        """The arguments as a dict (ValueError when they are not a JSON object, as a client may send)."""
        value = json.loads(self.arguments)
        if not isinstance(value, dict):
            raise ValueError(f"the arguments of call {self.id!r} are not a JSON object")
        return value


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def render_call(name: str, args: Mapping) -> str:
    """A call as the model writes it: strings as they are, other values as one-line JSON (as the chat
    template's `tojson` writes them). `parse_calls` reads it back (with the tool's schema for the types)
    unless a string value itself holds a structural `</parameter>` line."""
    parts = [f"{_OPEN}\n{_FUNC}{name}>\n"]
    for key, value in args.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"{_PARAM}{key}>\n{text}\n{_PARAM_END}\n")
    parts.append(f"{_FUNC_END}\n{_CLOSE}")
    return "".join(parts)


def call_opening(name: str | None) -> str:
    """The words that open the assistant's turn when a call is forced: any call (None), or `name`'s."""
    return f"{_OPEN}\n" if name is None else f"{_OPEN}\n{_FUNC}{name}>\n"


def parse_calls(text: str, tools: Sequence[ToolSpec]) -> tuple[str, list[ToolCall]]:
    """The content (the text outside the calls) and the calls, in order. Never raises."""
    items = CallStream(tools)._scan(text, final=True)
    return "".join(i for i in items if isinstance(i, str)), [i for i in items if isinstance(i, ToolCall)]


def parse_forced(opening: str, text: str, tools: Sequence[ToolSpec]) -> tuple[str, list[ToolCall]]:
    """The calls of an answer whose turn the prompt opened with `opening` (`call_opening`): the model's
    text continues the opening. When no call comes of it, the content starts with the opening."""
    return parse_calls(opening + text, tools)


class CallStream:
    """`parse_calls` on streamed text: `feed` each piece, then `flush` at the end of the answer. The pieces
    out, in order, are content text and whole calls; joined, they are what `parse_calls` gives for the whole
    text, however it was split."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._tools: dict[str, ToolSpec] = {}
        for tool in tools:
            self._tools.setdefault(tool.name, tool)
        self._held = ""  # text not yet decided: a possible tag's start, or an open call block
        self._space = ""  # whitespace at the end of the content so far: out only if more content follows
        self._thinking = False  # inside <think>...</think>, where nothing is parsed
        self._after_call = False  # whitespace right after a call is dropped
        self._open: _Block | None = None  # how far the open block at the start of _held has been read
        self._calls = 0

    @property
    def calls(self) -> int:
        """How many calls have come out so far."""
        return self._calls

    def feed(self, text: str) -> list[str | ToolCall]:
        return self._scan(text, final=False)

    def flush(self) -> list[str | ToolCall]:
        """The end of the answer: what was held comes out as content (an unclosed call block included)."""
        return self._scan("", final=True)

    def _scan(self, text: str, final: bool) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        buf, at = self._held + text, 0
        while at < len(buf):
            if self._thinking:
                end = buf.find(_THINK_END, at)
                if end < 0:
                    keep = 0 if final else _partial_tag(buf, at, (_THINK_END,))
                    self._content(out, buf[at : len(buf) - keep])
                    at = len(buf) - keep
                    break
                self._content(out, buf[at : end + len(_THINK_END)])
                at, self._thinking = end + len(_THINK_END), False
                continue
            if self._after_call:
                at = _skip_space(buf, at)
                if at == len(buf):
                    break
                self._after_call = False
            call_at = buf.find(_OPEN, at)
            opens = [i for i in (call_at, buf.find(_THINK, at, len(buf) if call_at < 0 else call_at)) if i >= 0]
            if not opens:
                keep = 0 if final else _partial_tag(buf, at, (_OPEN, _THINK))
                self._content(out, buf[at : len(buf) - keep])
                at = len(buf) - keep
                break
            start = min(opens)
            self._content(out, buf[at:start])
            if buf.startswith(_THINK, start):
                self._content(out, _THINK)
                at, self._thinking = start + len(_THINK), True
                continue
            progress = self._open if start == 0 and self._open is not None else _Block()
            self._open = None
            block = _block(buf, start, progress)
            if block is None:  # open: wait for more text, or at the end it is content
                if final:
                    self._content(out, buf[start:])
                    at = len(buf)
                else:
                    at, self._open = start, progress
                break
            if block is _MALFORMED:  # the tag is text; what follows it is read afresh
                self._content(out, _OPEN)
                at = start + len(_OPEN)
                continue
            assert isinstance(block, _Block)
            call = self._call(block)
            if call is None:
                self._content(out, buf[start : block.end])
            else:
                out.append(call)
                self._calls += 1
                self._after_call = True
            at = block.end
        self._held = buf[at:]
        if final:
            self._space = ""
        return out

    def _content(self, out: list[str | ToolCall], text: str) -> None:
        """Content goes out, except its trailing whitespace, which waits for more content."""
        if not text:
            return
        body = text.rstrip()
        if not body:
            self._space += text
            return
        piece, self._space = self._space + body, text[len(body) :]
        if out and isinstance(out[-1], str):
            out[-1] += piece
        else:
            out.append(piece)

    def _call(self, block: _Block) -> ToolCall | None:
        """The block's call, or None when it names a tool not offered or its JSON is not a call."""
        if block.raw_json is not None:
            named = _json_call(block.raw_json)
            if named is None:
                return None
            name, args = named
        else:
            name, args = block.name, {}
        tool = self._tools.get(name)
        if self._tools and tool is None:
            return None
        if block.raw_json is None:
            properties = tool.parameters.get("properties") if tool is not None else None
            if not isinstance(properties, Mapping):
                properties = {}
            args = {key: _convert(value, properties.get(key)) for key, value in block.params}
        return ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))


# --- reading one block ----------------------------------------------------------------------------------


@dataclass
class _Block:
    """A block read so far: whole once `end` is set. While it is open, a stream keeps it and the next read
    goes on from `resume` (and a value's end is looked for from `search`), not from the start again."""

    end: int = 0  # just past its </tool_call>
    name: str = ""
    params: list[tuple[str, str]] = field(default_factory=list)
    raw_json: str | None = None  # the Hermes form: the text between the tags
    resume: int = 0  # from the block's start: past its function's name, or its last whole parameter (0: none)
    search: int = 0  # from the block's start: where the end of the value after `resume` may be


_MALFORMED = object()


def _block(text: str, base: int, block: _Block) -> _Block | object | None:
    """The block whose `<tool_call>` starts at `base`, read on from `block` (what an earlier read of a shorter
    text found): the _Block when it is whole, None when the text ends before it does (it may yet be),
    _MALFORMED when it is not of the form. Each answer looks only at text that is there, so a longer text
    never changes it: that is what makes a stream's result the whole text's."""
    if not block.resume:
        at = _skip_space(text, base + len(_OPEN))
        if at == len(text):
            return None
        if text[at] == "{":
            end = text.find(_CLOSE, at)
            if end < 0:
                return None
            block.end, block.raw_json = end + len(_CLOSE), text[at:end]
            return block
        found = _tag(text, at, (_FUNC,))
        if found != _FUNC:
            return found  # None or _MALFORMED
        named = _name(text, at + len(_FUNC))
        if not isinstance(named, tuple):
            return named
        block.name, block.resume = named[0], named[1] - base
    at = base + block.resume
    while True:
        at = _skip_space(text, at)
        found = _tag(text, at, (_PARAM, _FUNC_END, _CLOSE))
        if not isinstance(found, str):
            return found
        if found == _CLOSE:  # a call without </function>: read as if it were there
            block.end = at + len(_CLOSE)
            return block
        if found == _FUNC_END:
            at = _skip_space(text, at + len(_FUNC_END))
            found = _tag(text, at, (_CLOSE,))
            if found != _CLOSE:
                return found
            block.end = at + len(_CLOSE)
            return block
        named = _name(text, at + len(_PARAM))
        if not isinstance(named, tuple):
            return named
        value = _value(text, named[1], base, block)
        if value is None:
            return None
        block.params.append((named[0], value[0]))
        at = value[1]
        block.resume, block.search = at - base, 0


def _tag(text: str, at: int, tags: tuple[str, ...]) -> str | object | None:
    """Which of `tags` starts at `at`; None when the text ends inside one's start; else _MALFORMED."""
    for tag in tags:
        if text.startswith(tag, at):
            return tag
    rest = text[at : at + max(len(t) for t in tags)]
    if any(len(rest) < len(tag) and tag.startswith(rest) for tag in tags):
        return None
    return _MALFORMED


def _name(text: str, at: int) -> tuple[str, int] | object | None:
    """The NAME of `<function=NAME>` or `<parameter=NAME>` from `at`, and where its `>` ends."""
    span = text[at : at + _MAX_NAME + 1]
    end = span.find(">")
    name = span if end < 0 else span[:end]
    if end == 0 or any(c in _BAD_NAME for c in name):
        return _MALFORMED
    if end < 0:
        return _MALFORMED if len(span) > _MAX_NAME else None
    return name, at + end + 1


def _value(text: str, at: int, base: int, block: _Block) -> tuple[str, int] | None:
    """A parameter's value from `at`, just past its `<parameter=NAME>`, and where its `</parameter>` ends;
    None while the structural `</parameter>` (one followed by a tag of the call) is not there yet. The
    search goes on from `block.search`, where the last read of this value left it."""
    search = max(at, base + block.search)
    while True:
        end = text.find(_PARAM_END, search)
        if end < 0:
            block.search = max(search, len(text) - len(_PARAM_END) + 1) - base
            return None
        after = end + len(_PARAM_END)
        follows = _tag(text, _skip_space(text, after), (_PARAM, _FUNC_END, _CLOSE))
        if follows is None:
            block.search = end - base
            return None
        if follows is not _MALFORMED:
            value = text[at:end]
            value = value[1:] if value[:1] in _EDGE else value
            value = value[:-1] if value[-1:] in _EDGE else value
            return value, after
        search = after


def _json_call(raw: str) -> tuple[str, dict] | None:
    """The name and arguments of a Hermes call, or None when the text is not one."""
    obj = _loads(raw.strip())
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        args = _loads(args)
    return (obj["name"], args) if isinstance(args, dict) else None


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _partial_tag(text: str, at: int, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text[at:]` that is a proper start of one of `tags`."""
    for size in range(min(max(len(t) for t in tags) - 1, len(text) - at), 0, -1):
        end = text[len(text) - size :]
        if any(t.startswith(end) for t in tags):
            return size
    return 0


# --- values by the schema -------------------------------------------------------------------------------

_MISS = object()  # no conversion but to the string itself


def _convert(text: str, schema: Any) -> Any:
    """A parameter's text as its schema types it; the text itself when it does not convert."""
    try:
        value = _typed(text, schema)
    except RecursionError:  # a schema nested past Python's limit: the text as it is
        return text
    return text if value is _MISS else value


def _typed(text: str, schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return _MISS
    enum = schema.get("enum")
    if isinstance(enum, list):
        if text in enum:
            return _MISS
        loaded = _loads(text)
        for member in enum:
            if not isinstance(member, str) and _same(loaded, member):
                return member
    for option in _options(schema):  # strings come out as _MISS, so any other type is tried first
        value = _typed(text, option) if isinstance(option, Mapping) else _by_type(text, option)
        if value is not _MISS:
            return value
    return _MISS


def _options(schema: Mapping) -> list:
    """The types a schema allows, in its order: type names and sub-schemas."""
    kind = schema.get("type")
    options: list = [kind] if isinstance(kind, str) else list(kind) if isinstance(kind, list) else []
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            options += schema[key]
    if not options and "properties" in schema:
        options = ["object"]
    elif not options and "items" in schema:
        options = ["array"]
    return options


def _by_type(text: str, kind: Any) -> Any:
    if not isinstance(kind, str):
        return _MISS
    kind = kind.strip().lower()
    kind = _TYPE_NAMES.get(kind, kind)
    word = text.strip()
    if kind == "integer":
        if _INT.fullmatch(word):
            return _int(word)
        number = _float(word)
        return int(number) if isinstance(number, float) and number.is_integer() else _MISS
    if kind == "number":
        return _int(word) if _INT.fullmatch(word) else _float(word)
    if kind == "boolean":
        return {"true": True, "false": False}.get(word.lower(), _MISS)
    if kind == "null":
        return None if word.lower() in ("null", "none") else _MISS
    if kind in ("object", "array"):
        value = _loads(word)
        return value if isinstance(value, dict if kind == "object" else list) else _MISS
    return _MISS


def _int(word: str) -> Any:
    try:
        return int(word)
    except ValueError:  # more digits than Python converts
        return _MISS


def _float(word: str) -> Any:
    if not _NUMBER.fullmatch(word):
        return _MISS
    number = float(word)
    return number if math.isfinite(number) else _MISS


def _same(loaded: Any, member: Any) -> bool:
    return loaded is not _MISS and isinstance(loaded, bool) == isinstance(member, bool) and loaded == member


def _reject_constant(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


def _loads(text: str) -> Any:
    """JSON text's value, or _MISS (NaN and Infinity are not JSON: they could not be sent on)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return _MISS
