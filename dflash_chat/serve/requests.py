"""Request bodies of /v1/chat/completions and /v1/completions, read and checked.

Each field we use is checked for its type and range, and a wrong one is a 400 naming it (`param`), as
OpenAI's API answers; the sampling fields by the same rules as the settings and the flags
(engine/rules.py), into the one SamplingParams the engine gets; the tools, the tool choice and the
turns that call tools or answer a call into a ToolUse and template turns (serve/tools.py). Fields we do
not use (logprobs, penalties, ...) are ignored, as clients send many of them by default. Sampling
defaults are the user's settings (config.toml), so `serve` answers like the app does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from dflash_chat.engine import rules
from dflash_chat.engine.rules import shown
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.runtime.prompt import Turn
from dflash_chat.runtime.tool_use import ToolUse
from dflash_chat.serve import tools as checked
from dflash_chat.serve.errors import bad_request
from dflash_chat.settings import Settings

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_STOPS = 16
MAX_STOP_CHARS = 1000
MAX_DEPTH = 64  # OpenAI bodies nest a few levels; tool schemas a few more


@dataclass(frozen=True)
class Streaming:
    stream: bool
    include_usage: bool  # a last chunk with `usage` (and the figures), as stream_options asks
    continuous_usage: bool  # `usage` in every chunk (vLLM's continuous_usage_stats)


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    turns: list[Turn]
    thinking: bool
    sampling: SamplingParams  # max_new_tokens None: up to the end of the context
    streaming: Streaming
    tools: ToolUse | None = None  # None: the request offers no tools


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


def chat_request(body: Mapping, defaults: Settings) -> ChatRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects.", "messages")
    turns = _turns(messages)
    kwargs = _optional(body, "chat_template_kwargs", Mapping) or {}
    thinking = kwargs.get("enable_thinking", defaults.thinking)
    if not isinstance(thinking, bool):
        raise bad_request(
            "'chat_template_kwargs.enable_thinking' must be true or false.", "chat_template_kwargs.enable_thinking"
        )
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    sampling = _sampling(body, defaults, limit, name)
    return ChatRequest(_model(body), turns, thinking, sampling, _streaming(body), _tool_use(body))


def completion_request(body: Mapping, defaults: Settings) -> CompletionRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        prompt = [int(t) for t in prompt]
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request(
            "'prompt' must be a non-empty string (or one list of token ids); batches are not supported.", "prompt"
        )
    limit = body.get("max_tokens", 16)  # OpenAI's default for completions
    return CompletionRequest(_model(body), prompt, _sampling(body, defaults, limit, "max_tokens"), _streaming(body))


def _model(body: Mapping) -> str | None:
    return _optional(body, "model", str)


def _turns(messages: list) -> list[Turn]:
    """The messages as template turns; a tool message must answer a call an earlier assistant turn made."""
    turns: list[Turn] = []
    calls: set[str] = set()
    for index, message in enumerate(messages):
        turn = _turn(message, index)
        if turn["role"] == "tool" and turn["tool_call_id"] not in calls:
            raise bad_request(
                f"'messages[{index}].tool_call_id' is {shown(turn['tool_call_id'])}, which answers no tool call "
                "an earlier assistant message made.",
                f"messages[{index}].tool_call_id",
            )
        calls.update(call["id"] for call in turn.get("tool_calls", ()))
        turns.append(turn)
    return turns


def _turn(message, index: int) -> Turn:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise bad_request(f"'{where}' must be an object with 'role' and 'content'.", where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise bad_request(f"'{where}.role' must be one of {', '.join(ROLES)}; got {shown(role)}.", f"{where}.role")
    turn: Turn = {"role": ROLES[role], "content": _content(message.get("content"), f"{where}.content")}
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(
                f"'{where}.tool_call_id' must name the call this message answers.", f"{where}.tool_call_id"
            )
        turn["tool_call_id"] = call_id
    if role == "assistant" and message.get("tool_calls") is not None:
        turn["tool_calls"] = _calls(message["tool_calls"], f"{where}.tool_calls")
    return turn


def _calls(calls, where: str) -> list[dict]:
    """An assistant message's tool calls, their arguments as mappings (the template writes them)."""
    if not isinstance(calls, list):
        raise bad_request(f"'{where}' must be a list of tool calls.", where)
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(call.get("id"), str) or not call["id"]:
            raise bad_request(f'\'{at}\' must be {{"id", "type": "function", "function": {{name, arguments}}}}.', at)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"'{at}.function.name' must be the called tool's name.", f"{at}.function.name")
        args = checked.arguments(function.get("arguments", "{}"), f"{at}.function.arguments")
        out.append({"id": call["id"], "type": "function", "function": {"name": name, "arguments": args}})
    return out


def _tool_use(body: Mapping) -> ToolUse | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` (OpenAI's shapes)."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of function tools.", "tools")
    specs = []
    for i, item in enumerate(tools):
        where = f"tools[{i}]"
        function = item.get("function") if isinstance(item, Mapping) else None
        if (
            not isinstance(item, Mapping)
            or item.get("type", "function") != "function"
            or not isinstance(function, Mapping)
        ):
            raise bad_request(f'\'{where}\' must be {{"type": "function", "function": {{name, parameters}}}}.', where)
        specs.append(
            checked.spec(
                function.get("name"), function.get("description"), function.get("parameters"), f"{where}.function"
            )
        )
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        function = choice.get("function")
        if (
            choice.get("type") != "function"
            or not isinstance(function, Mapping)
            or not isinstance(function.get("name"), str)
        ):
            raise bad_request(
                '\'tool_choice\' must be auto, none, required or {"type": "function", "function": {"name": ...}}.',
                "tool_choice",
            )
        choice = function["name"]
    elif choice is not None and choice not in ("auto", "none", "required"):
        raise bad_request(
            f"'tool_choice' must be auto, none, required or a named function; got {shown(choice)}.", "tool_choice"
        )
    return checked.tool_use(specs, choice, body.get("parallel_tool_calls", True))


def _content(content, where: str) -> str:
    """Text, or a list of text parts (OpenAI's content parts); images and audio are refused."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f'\'{where}\' may only hold text parts ({{"type": "text", "text": ...}}).', where)
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"'{where}' must be a string or a list of text parts.", where)


def _streaming(body: Mapping) -> Streaming:
    stream = _optional(body, "stream", bool) or False
    options = _optional(body, "stream_options", Mapping) or {}
    include = options.get("include_usage", False)
    continuous = options.get("continuous_usage_stats", False)
    for name, value in (("include_usage", include), ("continuous_usage_stats", continuous)):
        if not isinstance(value, bool):
            raise bad_request(f"'stream_options.{name}' must be true or false.", f"stream_options.{name}")
    return Streaming(stream, include, continuous)


def _sampling(body: Mapping, defaults: Settings, limit, limit_name: str) -> SamplingParams:
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise bad_request("Only one choice per request is supported ('n' must be 1).", "n")
    return SamplingParams(
        temperature=_ruled(body, "temperature", rules.TEMPERATURE, defaults.temperature),
        top_p=_ruled(body, "top_p", rules.TOP_P, defaults.top_p),
        top_k=_ruled(body, "top_k", rules.TOP_K, defaults.top_k),
        min_p=_ruled(body, "min_p", rules.MIN_P, defaults.min_p),
        max_new_tokens=None if limit is None else _checked(limit_name, rules.MAX_NEW_TOKENS, limit),
        seed=_ruled(body, "seed", rules.SEED, None),
        stop=_stops(body.get("stop")),
    )


def _ruled(body: Mapping, name: str, rule: rules.Number, default):
    """The field by its rule, or `default` when it is absent or null."""
    value = body.get(name)
    return default if value is None else _checked(name, rule, value)


def _checked(name: str, rule: rules.Number, value):
    try:
        return rule.check(value)
    except rules.Invalid as exc:
        raise bad_request(f"'{name}' {exc}.", name) from None


def _stops(stop) -> tuple[str, ...]:
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
            f"'stop' must be a string or a list of up to {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters.",
            "stop",
        )
    return tuple(s for s in stop if s)


def _optional(body: Mapping, name: str, kind: type):
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        what = {str: "a string", bool: "true or false", Mapping: "an object"}[kind]
        raise bad_request(f"'{name}' must be {what}.", name)
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
