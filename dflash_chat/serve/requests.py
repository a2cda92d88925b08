"""What every dialect's request becomes, and the checks they share.

`/v1/chat/completions` (serve/openai_chat.py), `/v1/messages` (serve/anthropic.py) and `/v1/responses`
(serve/openai_responses.py) each read their body into one ChatRequest: template turns, the tools offered,
the one SamplingParams the engine gets, the thinking switch and how to send the answer back. The body is
JSON checked here once (valid Unicode, at most MAX_DEPTH levels), and the sampling fields are read by the
rules the settings and the flags use (engine/rules.py): a wrong field is a 400 that names it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dflash_chat.engine import rules
from dflash_chat.engine.rules import shown
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.runtime.constraint import GrammarError, OutputFormat, check_schema, held_schema
from dflash_chat.runtime.prompt import Turn
from dflash_chat.runtime.tool_use import ToolUse
from dflash_chat.serve.errors import bad_request

MAX_STOPS = 16
MAX_STOP_CHARS = 1000
MAX_DEPTH = 64  # request bodies nest a few levels; tool schemas a few more


@dataclass(frozen=True)
class Streaming:
    stream: bool
    include_usage: bool = False  # a last chunk with `usage` (and the figures), as OpenAI's stream_options asks
    continuous_usage: bool = False  # `usage` in every chunk (vLLM's continuous_usage_stats)


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    turns: list[Turn]
    thinking: bool
    sampling: SamplingParams  # max_new_tokens None: up to the end of the context
    streaming: Streaming
    tools: ToolUse | None = None  # None: the request offers no tools
    prefill: str = ""  # the answer's first words, written by the client (Anthropic's prefill): the model goes on
    output: OutputFormat | None = None  # the answer must be JSON (runtime/constraint.py); None: free text


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str | list[int]
    sampling: SamplingParams
    streaming: Streaming


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object whose every string is valid Unicode and that nests at most MAX_DEPTH
    levels; anything else is a 400 in words (never the parser's exception)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: byte {exc.start} is not UTF-8 text.") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"The request body is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})."
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError:  # a number too long to read, or NaN / Infinity
        raise bad_request(
            "The request body is not valid JSON: it holds a number that is not finite or has thousands of digits."
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    _check_tree(body)
    return body


def _no_constant(name: str):
    raise ValueError(name)


def _too_deep():
    return bad_request(f"The request body nests deeper than {MAX_DEPTH} levels; send a flatter body.")


def _check_tree(body: dict) -> None:
    """Depth and text of every value, iteratively (a deep body must not recurse here either)."""
    stack: list[tuple[object, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise _too_deep()
            if isinstance(value, dict):
                for key in value:
                    _check_text(key)
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(
            f"The request body holds text that is not valid Unicode (a lone surrogate "
            f"\\u{ord(text[exc.start]):04x}); send real characters."
        ) from None


def ruled(body: Mapping, name: str, rule: rules.Number, default):
    """The field by its rule, or `default` when it is absent or null."""
    value = body.get(name)
    return default if value is None else checked(name, rule, value)


def checked(name: str, rule: rules.Number, value):
    try:
        return rule.check(value)
    except rules.Invalid as exc:
        raise bad_request(f"'{name}' {exc}.", name) from None


KNOBS: dict[str, rules.Number] = {
    "temperature": rules.TEMPERATURE,
    "top_p": rules.TOP_P,
    "top_k": rules.TOP_K,
    "min_p": rules.MIN_P,
    "seed": rules.SEED,
}


def sampling(
    body: Mapping,
    defaults: SamplingParams,
    limit_name: str,
    stop_name: str | None,
    knobs: tuple[str, ...] = ("temperature", "top_p", "top_k"),
    default_limit: int | None = None,
) -> SamplingParams:
    """The one sampling value of a body: the dialect's `knobs` by their rules over the server's `defaults`, the
    answer's limit from `limit_name` (absent: `default_limit`; None: up to the context's end), the stop
    strings from `stop_name` (None: the dialect has none)."""
    limit = body.get(limit_name, default_limit)
    return replace(
        defaults,
        **{name: ruled(body, name, KNOBS[name], getattr(defaults, name)) for name in knobs},
        max_new_tokens=None if limit is None else checked(limit_name, rules.MAX_NEW_TOKENS, limit),
        stop=() if stop_name is None else stops(body.get(stop_name), stop_name),
    )


def stops(stop, field: str = "stop") -> tuple[str, ...]:
    """A string or a list of strings that end the answer's text."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOPS
        or not all(isinstance(s, str) and len(s) <= MAX_STOP_CHARS for s in stop)
    ):
        raise bad_request(
            f"'{field}' must be a string or a list of up to {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters.",
            field,
        )
    return tuple(s for s in stop if s)


def text_content(content, where: str, kinds: tuple[str, ...] = ("text",), separator: str = "") -> str:
    """Text, or a list of text parts (`kinds`: the part types that hold text in this dialect) joined by
    `separator`; images and audio are refused."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
                raise bad_request(
                    f'\'{where}\' may only hold text parts ({{"type": "{kinds[0]}", "text": ...}}).', where
                )
            texts.append(part["text"])
        return separator.join(texts)
    raise bad_request(f"'{where}' must be a string or a list of text parts.", where)


def content_parts(
    content, where: str, kinds: tuple[str, ...], image: Callable[[Mapping, str], dict | None], shape: str
) -> str | list[dict]:
    """A content that may hold images: its text as `text_content` joins it when it holds none, else its text and image
    parts in order (text parts as `{"type": "text"}`). `image(part, at)`: the dialect's image part read into a turn's
    image part (serve/images.py), None for a part that is no image; `shape` names the parts taken, for the 400."""
    if not isinstance(content, list):
        return text_content(content, where, kinds)
    parts: list[dict] = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        if isinstance(part, Mapping) and part.get("type") in kinds and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
            continue
        shown = image(part, at) if isinstance(part, Mapping) else None
        if shown is None:
            raise bad_request(f"'{where}' may only hold {shape}.", where)
        parts.append(shown)
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def optional(body: Mapping, name: str, kind: type):
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        what = {str: "a string", bool: "true or false", Mapping: "an object"}[kind]
        raise bad_request(f"'{name}' must be {what}.", name)
    return value


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def output_format(value, where: str, schema_at: str) -> OutputFormat | None:
    """An output format as OpenAI's `response_format` and Responses' `text.format` write it (`schema_at`: the
    schema's key within it, "json_schema.schema" or "schema"): text (None), any JSON object, or JSON valid for a
    schema, which is checked here (a 400 naming what is wrong). Anthropic's `output_config.format` is the
    json_schema kind with the schema at "schema"."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request(f"'{where}' must be an object with a 'type'.", where)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat(None, where)
    if kind != "json_schema":
        raise bad_request(
            f"'{where}.type' must be text, json_object or json_schema; got {shown(kind)}.", f"{where}.type"
        )
    holder: Any = value
    key = schema_at
    if "." in schema_at:
        outer, key = schema_at.split(".", 1)
        holder = value.get(outer)
        if not isinstance(holder, Mapping):
            raise bad_request(f"'{where}.{outer}' must be an object with the 'schema'.", f"{where}.{outer}")
    at = f"{where}.{schema_at}"
    schema = holder.get(key)
    if not isinstance(schema, Mapping):
        raise bad_request(f"'{at}' must be a JSON schema (an object).", at)
    try:
        check_schema(dict(schema), at)
        held = held_schema(dict(schema), at)
    except GrammarError as exc:
        raise bad_request(str(exc), at) from None
    return OutputFormat(held, at)
