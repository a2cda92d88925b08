"""OpenAI's chat completions and completions: the request bodies read, the answers written as OpenAI's API
(and vLLM, llama.cpp) write them.

Each field we use is checked for its type and range, and a wrong one is a 400 naming it (`param`), as
OpenAI's API answers; the turns that call tools or answer a call become template turns, and the tools
and the tool choice a ToolUse (serve/tools.py). Fields we do not use (logprobs, penalties, ...) are
ignored, as clients send many of them by default. Sampling defaults are the user's settings.

Beside `usage`, every finished answer carries the engine's own figures twice: vLLM's per-request
`metrics.speculative_decoding` and llama.cpp's `timings` (runtime/openai_protocol.py), so tools made
for either read them. Thinking goes to `reasoning_content`, as vLLM's and llama.cpp's reasoning
parsers write it. Tool calls go to `message.tool_calls` (arguments as a JSON text), and in a stream to
`delta.tool_calls` items by index, each call whole in one item: its id, type, name and arguments.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

from dflash_chat.engine.events import GenerationStats
from dflash_chat.engine.rules import shown
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.runtime.bridge import StreamChunk, StreamEnd
from dflash_chat.runtime.openai_protocol import llama_timings, speculative_decoding
from dflash_chat.runtime.prompt import Turn
from dflash_chat.runtime.tool_calls import ToolCall, ToolSpec
from dflash_chat.runtime.tool_use import ToolUse
from dflash_chat.serve import tools as checked_tools
from dflash_chat.serve.errors import bad_request, error_body
from dflash_chat.serve.images import source_part
from dflash_chat.serve.requests import (
    KNOBS,
    ChatRequest,
    CompletionRequest,
    Streaming,
    content_parts,
    is_int,
    optional,
    output_format,
)
from dflash_chat.serve.requests import (
    sampling as checked_sampling,
)
from dflash_chat.serve.writer import sse
from dflash_chat.settings import Settings

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

# reading


def chat_request(body: Mapping, defaults: Settings) -> ChatRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects.", "messages")
    turns = _turns(messages)
    kwargs = optional(body, "chat_template_kwargs", Mapping) or {}
    thinking = kwargs.get("enable_thinking", defaults.thinking)
    if not isinstance(thinking, bool):
        raise bad_request(
            "'chat_template_kwargs.enable_thinking' must be true or false.", "chat_template_kwargs.enable_thinking"
        )
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    sampling = _sampling(body, defaults, name)
    output = output_format(body.get("response_format"), "response_format", "json_schema.schema")
    return ChatRequest(_model(body), turns, thinking, sampling, _streaming(body), _tool_use(body), output=output)


def completion_request(body: Mapping, defaults: Settings) -> CompletionRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(is_int(t) and t >= 0 for t in prompt):
        prompt = [int(t) for t in prompt]
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request(
            "'prompt' must be a non-empty string (or one list of token ids); batches are not supported.", "prompt"
        )
    sampling = _sampling(body, defaults, "max_tokens", default_limit=16)  # OpenAI's default for completions
    return CompletionRequest(_model(body), prompt, sampling, _streaming(body))


def _model(body: Mapping) -> str | None:
    return optional(body, "model", str)


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
    turn: Turn = {"role": ROLES[role], "content": _content(message.get("content"), f"{where}.content", ROLES[role])}
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


TEXT_SHAPE = 'text parts ({"type": "text", "text": ...})'
IMAGE_SHAPE = (
    'text parts ({"type": "text", "text": ...}) and image_url parts ({"type": "image_url", "image_url": {"url": ...}})'
)


def _content(content, where: str, role: str) -> str | list[dict]:
    """A message's content: text, or (a user's) text and images."""
    if role != "user":
        return content_parts(content, where, ("text",), partial(_no_image, role), TEXT_SHAPE)
    return content_parts(content, where, ("text",), _image, IMAGE_SHAPE)


def _image(part: Mapping, at: str) -> dict | None:
    """An `image_url` part (its `image_url` an object with the `url`, or the URL itself), or None."""
    if part.get("type") != "image_url":
        return None
    value = part.get("image_url")
    return source_part(value.get("url") if isinstance(value, Mapping) else value, f"{at}.image_url")


def _no_image(role: str, part: Mapping, at: str) -> None:
    if part.get("type") == "image_url":
        raise bad_request(f"'{at}' is an image in a {role} message: only user messages may hold images.", at)


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
        args = checked_tools.arguments(function.get("arguments", "{}"), f"{at}.function.arguments")
        out.append({"id": call["id"], "type": "function", "function": {"name": name, "arguments": args}})
    return out


def _tool(item, where: str) -> ToolSpec:
    function = item.get("function") if isinstance(item, Mapping) else None
    if not isinstance(item, Mapping) or item.get("type", "function") != "function" or not isinstance(function, Mapping):
        raise bad_request(f'\'{where}\' must be {{"type": "function", "function": {{name, parameters}}}}.', where)
    return checked_tools.spec(
        function.get("name"), function.get("description"), function.get("parameters"), f"{where}.function"
    )


def _tool_use(body: Mapping) -> ToolUse | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` (OpenAI's shapes)."""
    specs = checked_tools.specs(body, "function tools", _tool)
    choice = checked_tools.openai_choice(
        body.get("tool_choice"),
        lambda choice: choice["function"].get("name") if isinstance(choice.get("function"), Mapping) else None,
        '{"type": "function", "function": {"name": ...}}',
    )
    return checked_tools.tool_use(specs, choice, body.get("parallel_tool_calls", True))


def _streaming(body: Mapping) -> Streaming:
    stream = optional(body, "stream", bool) or False
    options = optional(body, "stream_options", Mapping) or {}
    include = options.get("include_usage", False)
    continuous = options.get("continuous_usage_stats", False)
    for name, value in (("include_usage", include), ("continuous_usage_stats", continuous)):
        if not isinstance(value, bool):
            raise bad_request(f"'stream_options.{name}' must be true or false.", f"stream_options.{name}")
    return Streaming(stream, include, continuous)


def _sampling(body: Mapping, defaults: Settings, limit_name: str, default_limit: int | None = None) -> SamplingParams:
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise bad_request("Only one choice per request is supported ('n' must be 1).", "n")
    return checked_sampling(body, defaults.sampling(), limit_name, "stop", tuple(KNOBS), default_limit)


# writing


FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


@dataclass(frozen=True)
class Kind:
    """A chat completion or a plain completion: their ids, object names and where text goes."""

    chat: bool
    id: str
    model: str
    created: int

    @classmethod
    def new(cls, chat: bool, model: str) -> Kind:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(chat, f"{prefix}-{uuid.uuid4().hex}", model, int(time.time()))

    def head(self, chunk: bool) -> dict:
        name = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": name, "created": self.created, "model": self.model}


def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": stats.prompt_tokens + stats.new_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
    }


def figures(stats: GenerationStats, spec_tokens: int) -> dict:
    """`metrics` (the drafts, when it drafted) and `timings` of one answer."""
    extra: dict = {"timings": llama_timings(stats)}
    if stats.speculative:
        extra["metrics"] = {"speculative_decoding": speculative_decoding(stats, spec_tokens)}
    return extra


def _finished_stats(end: StreamEnd) -> GenerationStats:
    """The server answers only answers that did not fail, and those carry the engine's stats."""
    assert end.stats is not None, "an answer without stats ended in error; it is sent as a failure"
    return end.stats


def finish_reason(end: StreamEnd) -> str:
    if end.tool_calls and end.reason != "error":
        return "tool_calls"
    return FINISH.get(end.reason, "stop")


def call_body(call: ToolCall, index: int | None = None) -> dict:
    body = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return body if index is None else {"index": index, **body}


def completion(kind: Kind, end: StreamEnd, spec_tokens: int) -> dict:
    if kind.chat:
        message: dict = {"role": "assistant", "content": end.answer, "reasoning_content": end.thinking or None}
        if end.tool_calls:
            message["content"] = end.answer or None
            message["tool_calls"] = [call_body(call) for call in end.tool_calls]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(end)}
    else:
        choice = {"index": 0, "text": end.answer, "logprobs": None, "finish_reason": finish_reason(end)}
    stats = _finished_stats(end)
    return {**kind.head(False), "choices": [choice], "usage": usage(stats), **figures(stats, spec_tokens)}


def _choice(
    kind: Kind, thinking: str, answer: str, finish: str | None, first: bool = False, calls: list[dict] | None = None
) -> dict:
    if not kind.chat:
        return {"index": 0, "text": thinking + answer, "logprobs": None, "finish_reason": finish}
    delta: dict = {"role": "assistant"} if first else {}
    if thinking:
        delta["reasoning_content"] = thinking
    if answer or first:
        delta["content"] = answer
    if calls:
        delta["tool_calls"] = calls
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def first_chunk(kind: Kind) -> dict | None:
    """A chat stream opens with the assistant's role, as OpenAI's does."""
    return {**kind.head(True), "choices": [_choice(kind, "", "", None, first=True)]} if kind.chat else None


def text_chunk(kind: Kind, chunk: StreamChunk, prompt_tokens: int | None, calls_before: int = 0) -> dict:
    """A chunk of new text and the calls completed since the last; `calls_before`: calls already sent (their
    index goes on from there)."""
    calls = [call_body(call, calls_before + i) for i, call in enumerate(chunk.tool_calls)]
    body = {**kind.head(True), "choices": [_choice(kind, chunk.thinking, chunk.answer, None, calls=calls)]}
    if prompt_tokens is not None:  # continuous usage stats
        new = chunk.live.new_tokens
        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": new, "total_tokens": prompt_tokens + new}
    return body


def last_chunks(kind: Kind, end: StreamEnd, spec_tokens: int, include_usage: bool) -> list[dict]:
    """The chunk with the finish reason (and the figures, as llama.cpp's last chunk has them), then
    the usage chunk (no choices) when stream_options asked for it, as OpenAI's and vLLM's."""
    stats = _finished_stats(end)
    extra = figures(stats, spec_tokens)
    last = {**kind.head(True), "choices": [_choice(kind, "", "", finish_reason(end))], **extra}
    if not include_usage:
        return [last]
    return [last, {**kind.head(True), "choices": [], "usage": usage(stats), **extra}]


class ChatWriter:
    """One answer of /v1/chat/completions or /v1/completions: a whole body, or chunks and then [DONE]."""

    def __init__(self, kind: Kind, spec_tokens: int, streaming: Streaming, prompt_tokens: int) -> None:
        self.kind, self.spec_tokens, self.streaming = kind, spec_tokens, streaming
        self.route = "chat.completions" if kind.chat else "completions"
        self.continuous = prompt_tokens if streaming.continuous_usage else None
        self.calls = 0  # tool calls sent so far: the next one's index

    def whole(self, end: StreamEnd) -> dict:
        return completion(self.kind, end, self.spec_tokens)

    def opening(self) -> list[str]:
        first = first_chunk(self.kind)
        return [sse(first)] if first is not None else []

    def chunk(self, chunk: StreamChunk) -> list[str]:
        if not (chunk.thinking or chunk.answer or chunk.tool_calls):
            return []
        body = text_chunk(self.kind, chunk, self.continuous, self.calls)
        self.calls += len(chunk.tool_calls)
        return [sse(body)]

    def closing(self, end: StreamEnd) -> list[str]:
        bodies = last_chunks(self.kind, end, self.spec_tokens, self.streaming.include_usage)
        return [sse(body) for body in bodies] + [sse("[DONE]")]

    def failure(self, message: str, kind: str, code: str | None) -> list[str]:
        return [sse(error_body(message, kind, None, code)), sse("[DONE]")]

    def ping(self) -> list[str]:
        return []  # OpenAI's streams send nothing between chunks

    def cut(self) -> None:
        pass  # this dialect keeps no answers
