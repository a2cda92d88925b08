"""The one constraint an answer is held to, made from what was asked: the tools offered (runtime/tool_use.py)
and the output format (a JSON schema, or any JSON object), for serve's three dialects, `run` and the chat.

- Tools offered, choice "auto": free text (and thinking) until the model opens a call; from there the call is
  held to the offered tools: a name among them, its parameters typed by the schema, required ones present,
  the closing tags. `required` or a named tool: the call from the answer's first token (the prompt already
  holds its opening, `call_opening`, which the grammar starts after). "none" offers nothing: no call.
- An output format: the answer is one JSON value valid for the schema; with thinking on, the think block is
  free and the JSON starts after it. A forced call wins over an output format (the call is the answer).
- What the prompt already holds of the answer (a forced call's opening, Anthropic's prefill) is the grammar's
  start: a prefill the grammar refuses is a GrammarError.

The grammar itself is the engine's (engine/structured.py); a constraint the engine cannot compile is a
GrammarError whose message names the part (serve answers it with a 400).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_chat.engine.constraint import Constraint, GrammarError, json_tag, tool_calls_tag

if TYPE_CHECKING:
    from dflash_chat.runtime.prompt import Prompt
    from dflash_chat.runtime.tool_use import ToolUse


@dataclass(frozen=True)
class OutputFormat:
    """The answer's text must be JSON: valid for `schema`, or any JSON object when `schema` is None."""

    schema: dict | None = None
    name: str = "response_format"  # where the request gave it, for messages

    @property
    def label(self) -> str:
        return f"'{self.name}'"


def answer_constraint(prompt: Prompt, tools: ToolUse | None, output: OutputFormat | None) -> Constraint | None:
    """The constraint of an answer to `prompt` (None: the answer is free)."""
    thinking = prompt.opens_thinking
    if tools is not None and tools.offered and (tools.forced or output is None):
        constraint = tool_calls_tag(
            [tool.as_openai() for tool in tools.tools],
            tools.choice,
            thinking=thinking and not tools.forced,
            parallel=tools.parallel,
            label="'tools'",
        )
        return Constraint(constraint.kind, constraint.spec, prefix=prompt.opening, label=constraint.label)
    if output is not None:
        schema = output.schema if output.schema is not None else True
        constraint = json_tag(schema, thinking=thinking, label=output.label)
        return Constraint(constraint.kind, constraint.spec, prefix=prompt.opening, label=constraint.label)
    return None


def check_schema(schema: dict, at: str) -> None:
    """A GrammarError naming the first thing wrong with `schema` as a JSON schema (by its own dialect's
    metaschema, draft 2020-12 when it names none); `at` is where it was given."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "".join(f"[{part!r}]" for part in exc.path)
        raise GrammarError(f"'{at}{path}' is not a valid JSON schema: {exc.message[:300]}") from None


# keywords the grammar engine would not hold an answer to (xgrammar reads past them): an answer could break them,
# so a schema that uses them is refused in words instead (unevaluated*: what they allow depends on the rest)
UNHELD = {
    "not": "'not'",
    "if": "'if'/'then'/'else'",
    "dependentRequired": "'dependentRequired'",
    "dependentSchemas": "'dependentSchemas'",
    "dependencies": "'dependencies'",
    "contains": "'contains'",
    "patternProperties": "'patternProperties'",
    "unevaluatedProperties": "'unevaluatedProperties'",
    "unevaluatedItems": "'unevaluatedItems'",
}


def held_schema(schema: dict, at: str) -> dict:
    """`schema` as the grammar engine holds it: an `allOf` of objects merged into one (their properties and
    required keys together), a one-element `allOf` inlined; a GrammarError names a keyword it cannot hold (UNHELD,
    `uniqueItems`, an `allOf` whose parts disagree), with where it is."""
    return _held(schema, at)


def _held(node, at: str):
    if isinstance(node, list):
        return [_held(item, f"{at}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    for key, words in UNHELD.items():
        if key in node:
            raise GrammarError(f"'{at}' uses {words}, which an answer cannot be held to here: leave it out")
    if node.get("uniqueItems") is True:
        raise GrammarError(f"'{at}' uses 'uniqueItems', which an answer cannot be held to here: leave it out")
    # the grammar engine reads a string's length past a `pattern` or a `format`: a pattern with one is refused; a
    # format (an annotation, which validators do not assert by default) gives way to the length
    lengths = [key for key in ("minLength", "maxLength") if key in node]
    if lengths and "pattern" in node:
        raise GrammarError(
            f"'{at}' has both 'pattern' and '{lengths[0]}', which an answer cannot be held to together here: "
            "write the length into the pattern"
        )
    if lengths and "format" in node:
        node = {key: value for key, value in node.items() if key != "format"}
    out = {}
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _held(part, f"{at}.{key}.{name}") for name, part in value.items()}
        elif key in ("enum", "const", "default", "examples", "required"):
            out[key] = value  # values, not schemas
        else:
            out[key] = _held(value, f"{at}.{key}")
    parts = out.pop("allOf", None)
    return out if parts is None else _merged(out, parts, f"{at}.allOf")


def _merged(base: dict, parts, at: str) -> dict:
    """`base` with each `allOf` part folded in, where they combine without conflict."""
    if not isinstance(parts, list):
        raise GrammarError(f"'{at}' must be a list of schemas")
    merged = dict(base)
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or "$ref" in part and len(parts) > 1:
            raise GrammarError(f"'{at}[{i}]': an allOf of references cannot be held to here: write the schema out")
        for key, value in part.items():
            if key == "properties":
                props = dict(merged.get("properties", {}))
                for name, sub in value.items():
                    if name in props and props[name] != sub:
                        raise GrammarError(f"'{at}[{i}].properties.{name}' differs from another part's: merge them")
                    props[name] = sub
                merged["properties"] = props
            elif key == "required":
                merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
            elif key in merged and merged[key] != value and key not in ("description", "title"):
                raise GrammarError(f"'{at}[{i}].{key}' differs from another part's: merge them")
            else:
                merged.setdefault(key, value)
    return merged


def read_schema(given: str, at: str = "--json-schema") -> OutputFormat:
    """A JSON schema given inline (it starts with "{") or as a file's path, checked (GrammarError in words)."""
    text = given
    if not given.lstrip().startswith("{"):
        try:
            text = Path(given).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise GrammarError(
                f"{at}: cannot read {given!r} ({exc.__class__.__name__}): give a JSON schema or its file"
            ) from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{at}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(schema, dict):
        raise GrammarError(f"{at}: a JSON schema is an object, not {type(schema).__name__}")
    check_schema(schema, at)
    return OutputFormat(held_schema(schema, at), at)


__all__ = [
    "GrammarError",
    "OutputFormat",
    "answer_constraint",
    "check_schema",
    "held_schema",
    "json_tag",
    "read_schema",
]
