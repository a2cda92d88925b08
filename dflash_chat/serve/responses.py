"""Response objects and stream chunks, shaped as OpenAI's API (and vLLM, llama.cpp) write them.

Beside `usage`, every finished answer carries the engine's own figures twice: vLLM's per-request
`metrics.speculative_decoding` and llama.cpp's `timings` (runtime/openai_protocol.py), so tools made
for either read them. Thinking goes to `reasoning_content`, as vLLM's and llama.cpp's reasoning
parsers write it. Tool calls go to `message.tool_calls` (arguments as a JSON text), and in a stream to
`delta.tool_calls` items by index, each call whole in one item: its id, type, name and arguments.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from dflash_chat.engine.events import GenerationStats
from dflash_chat.runtime.bridge import StreamChunk, StreamEnd
from dflash_chat.runtime.openai_protocol import llama_timings, speculative_decoding
from dflash_chat.runtime.tool_calls import ToolCall

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


def sse(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)}\n\n"
