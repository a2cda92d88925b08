"""What an answer may be held to, as data (no torch; xgrammar only inside the builders): a `Constraint`, the
builders for Qwen3.5/3.6's tool calls and for JSON, and the error of one that cannot be held. The grammar
engine that holds an answer to it is engine/structured.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_WHITESPACE = 2  # whitespace a JSON value may hold between its tokens (unbounded lets a model pad forever)


class GrammarError(ValueError):
    """A constraint the engine cannot hold an answer to (it does not compile, takes too long, or allows
    nothing): the message says which part and what to do."""


@dataclass(frozen=True)
class Constraint:
    """What an answer is held to. `kind`: "json_schema" (`spec` a schema's JSON text), "structural_tag"
    (`spec` xgrammar's structural tag as JSON text) or "ebnf" (a grammar in xgrammar's EBNF, root `root`); `prefix`: text the prompt already holds of it (a forced
    call's opening), which the grammar starts after; `label`: what it holds, for messages."""

    kind: str
    spec: str
    prefix: str = ""
    label: str = "the answer"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def tool_calls_tag(
    tools: list[dict], choice: str, *, thinking: bool, parallel: bool, label: str = "the tools"
) -> Constraint:
    """Calls in Qwen3.5/3.6's XML form to `tools` (OpenAI's shape): `choice` "auto" (text until the model opens a
    call, then the call held to the tools' schemas), "required" (a call from the first token) or a tool's name
    (that one). `thinking`: the prompt leaves a think block open, which stays free text up to its end.

    Built from xgrammar's parts rather than its `qwen_3_5` template, which wants a blank line inside a call
    with no parameters (`<function=f>\n\n</function>`), where Qwen's chat template writes none."""
    from xgrammar.structural_tag import StructuralTag, TriggeredTagsFormat

    try:
        tags = {tool["function"]["name"]: _call_tag(tool["function"]) for tool in tools}
        body: Any
        if choice not in ("auto", "required"):
            body = tags[choice]
        else:
            # any "<tool_call>" opens a call held to the tools; the call's other tags never stand alone in text
            body = TriggeredTagsFormat(
                triggers=[CALL_TRIGGER],
                tags=list(tags.values()),
                excludes=[*THINK_TAGS, "</tool_call>", "<function=", "</function>"],
                at_least_one=choice == "required",
                stop_after_first=not parallel,
            )
        if thinking:
            body = _after_thinking(body)
        tag = StructuralTag(format=body)
    except Exception as exc:  # noqa: BLE001 - pydantic's and xgrammar's errors alike are the tools' problem
        raise GrammarError(f"{label}: {first_line(exc)}") from None
    return Constraint("structural_tag", tag.model_dump_json(), label=label)


CALL_TRIGGER = "<tool_call>"
THINK_TAGS = ("<think>", "</think>")


def _call_tag(function: dict):
    """One tool's call: its name, its parameters in the XML form typed by its schema, the closing tags."""
    from xgrammar.structural_tag import ConstStringFormat, JSONSchemaFormat, OrFormat, SequenceFormat, TagFormat

    schema = function.get("parameters") or {"type": "object"}
    # one whitespace at most in a run: no padding around a value (a string is exactly what the parser reads
    # between the format's newlines, so maxLength and enum hold), at the cost of a string that ends in a newline
    params = JSONSchemaFormat(json_schema=schema, style="qwen_xml", max_whitespace_cnt=1)
    written = SequenceFormat(elements=[params, ConstStringFormat(value="\n")])
    content = written if schema.get("required") else OrFormat(elements=[ConstStringFormat(value=""), written])
    name = function["name"]
    return TagFormat(begin=f"<tool_call>\n<function={name}>\n", content=content, end="</function>\n</tool_call>")


def _after_thinking(body):
    """`body` after a free think block the prompt opened (its end tag, then the blank line Qwen writes)."""
    from xgrammar.structural_tag import AnyTextFormat, ConstStringFormat, SequenceFormat, TagFormat

    think = TagFormat(begin="", content=AnyTextFormat(excludes=list(THINK_TAGS)), end="</think>")
    return SequenceFormat(elements=[think, ConstStringFormat(value="\n\n"), body])


def json_tag(schema: object, *, thinking: bool, label: str = "the response format") -> Constraint:
    """An answer that is one JSON value valid for `schema` (True: any JSON object), after a free think block when
    `thinking` (the prompt left one open)."""
    from xgrammar.structural_tag import JSONSchemaFormat, StructuralTag

    if schema is True:
        schema = {"type": "object"}
    if not isinstance(schema, dict):
        raise GrammarError(f"{label}: the schema must be a JSON object")
    if not thinking:  # one JSON value, one line: what it forces (keys, punctuation) is forced whole
        return Constraint("json_schema", schema_text(schema), label=label)
    try:
        body = JSONSchemaFormat(json_schema=schema, max_whitespace_cnt=MAX_WHITESPACE)
        tag = StructuralTag(format=_after_thinking(body))
    except Exception as exc:  # noqa: BLE001 - pydantic's errors: the schema's shape
        raise GrammarError(f"{label}: {first_line(exc)}") from None
    return Constraint("structural_tag", tag.model_dump_json(), label=label)


def schema_text(schema: object) -> str:
    """A schema as the grammar compiles it and the cache keys it: its keys in the order given (the order of
    `properties` is the order the answer writes them in)."""
    return json.dumps(schema, ensure_ascii=False)
