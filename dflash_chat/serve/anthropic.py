"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`): what Claude Code speaks.

A body is read into the internal ChatRequest: `system` becomes the system turn, text blocks text, an
assistant's `tool_use` blocks its tool calls and its `thinking` blocks its reasoning, a user's
`tool_result` blocks tool turns (before the user's own text, as Anthropic orders them), a last assistant
message of text the answer's beginning (a prefill: the model goes on from it); `tools`
(`input_schema`) and `tool_choice` (auto, any, tool, none) a ToolUse; `thinking` the thinking switch.
Fields Anthropic lets clients send that we do not use (`metadata`, `cache_control`, `anthropic-beta`
headers) are accepted and ignored. A user's `image` blocks (and a tool_result's: Claude Code reads image files so)
are the turn's images, their source base64 data or, with --allow-image-urls, a URL (serve/images.py); a document
is a 400 until documents are supported, and so is an image in the system prompt. The answer
is written as Anthropic writes it: content blocks (thinking, text, tool_use with `input` typed by the
schema), `stop_reason`, `usage` (`cache_read_input_tokens` are the prompt tokens the engine reused), and
as its server-sent events when streamed; errors in its shape.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

from dflash_chat.engine.rules import shown
from dflash_chat.runtime.bridge import StreamChunk, StreamEnd
from dflash_chat.runtime.prompt import Turn
from dflash_chat.runtime.tool_calls import ToolCall, ToolSpec
from dflash_chat.runtime.tool_use import ToolUse
from dflash_chat.serve import tools as checked_tools
from dflash_chat.serve.errors import ApiError, bad_request
from dflash_chat.serve.images import source_part
from dflash_chat.serve.openai_chat import figures
from dflash_chat.serve.requests import ChatRequest, Streaming, content_parts, optional, output_format, text_content
from dflash_chat.serve.requests import sampling as checked_sampling
from dflash_chat.serve.writer import sse
from dflash_chat.settings import Settings

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
KIND_TYPES = {"server_error": "api_error", "service_unavailable": "overloaded_error"}
STOP_REASONS = {"length": "max_tokens"}
MIN_THINKING_BUDGET = 1024  # tokens: the least `thinking.budget_tokens` Anthropic's API takes
UNSUPPORTED = ("document", "search_result", "container_upload")

# reading


def messages_request(body: Mapping, defaults: Settings, *, counting: bool = False) -> ChatRequest:
    """A Messages body as the internal request; `counting` (count_tokens): no `max_tokens` needed."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects.", "messages")
    turns = _system(body.get("system"), messages) + _turns([m for m in messages if not _is_system(m)])
    limit = body.get("max_tokens")
    if limit is None and not counting:
        raise bad_request("'max_tokens' is required: the most tokens the answer may have.", "max_tokens")
    sampling = checked_sampling(body, defaults.sampling(), "max_tokens", "stop_sequences")
    stream = optional(body, "stream", bool) or False
    thinking, tools = _thinking(body, sampling.max_new_tokens), _tool_use(body)
    turns, prefill = _prefill(turns, tools)
    return ChatRequest(
        optional(body, "model", str),
        turns,
        thinking,
        sampling,
        Streaming(stream),
        tools,
        prefill,
        output=_output(body),
    )


def _prefill(turns: list[Turn], tools: ToolUse | None) -> tuple[list[Turn], str]:
    """(the turns, the prefill): a last assistant message of text is the answer's beginning, which the model goes
    on from, as Anthropic's API does (a prefill steers the format); its answer is only what follows."""
    last = turns[-1] if turns else {}
    if last.get("role") != "assistant" or last.get("tool_calls") or last.get("reasoning_content"):
        return turns, ""
    text = last["content"]
    if text != text.rstrip():
        raise bad_request("The final assistant message (a prefill) cannot end with whitespace.", "messages")
    if text and tools is not None and tools.opening():
        raise bad_request(
            "A final assistant message (a prefill) cannot be used when 'tool_choice' forces a tool call.",
            "tool_choice",
        )
    return turns[:-1], text


def _output(body: Mapping):
    """`output_config.format` (or the beta's `output_format`): a json_schema the answer is held to."""
    config = optional(body, "output_config", Mapping)
    if config is not None and config.get("format") is not None:
        return output_format(config.get("format"), "output_config.format", "schema")
    return output_format(body.get("output_format"), "output_format", "schema")


def _system(system, messages: list) -> list[Turn]:
    """The system turn: `system`, then the text of any system-role messages (newer clients, Claude Code among
    them, put some in `messages`; chat templates take one system turn, first)."""
    texts = [_text_blocks(system, "system")] if system is not None else []
    for index, message in enumerate(messages):
        if _is_system(message):
            texts.append(_text_blocks(message.get("content"), f"messages[{index}].content"))
    text = "\n\n".join(t for t in texts if t)
    return [{"role": "system", "content": text}] if text else []


def _is_system(message) -> bool:
    return isinstance(message, Mapping) and message.get("role") == "system"


def _text_blocks(content, where: str) -> str:
    """A string, or a list of text blocks (their cache_control ignored; the system's joined by blank lines)."""
    if content is None:
        raise bad_request(f"'{where}' must be a string or a list of text blocks.", where)
    for i, block in enumerate(content if isinstance(content, list) else ()):
        kind = block.get("type") if isinstance(block, Mapping) else None
        at = f"{where}[{i}]"
        if kind == "image":
            raise bad_request(f"'{at}' is an image block: images go in user messages, not the system prompt.", at)
        if kind in UNSUPPORTED:
            raise bad_request(f"'{at}' is a {kind} block: only text is supported here for now.", f"{at}.type")
    return text_content(content, where, separator="\n\n" if where == "system" else "")


def _turns(messages: list) -> list[Turn]:
    turns: list[Turn] = []
    calls: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise bad_request(f"'{where}' must be an object with 'role' and 'content'.", where)
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise bad_request(f"'{where}.role' must be user, assistant or system; got {shown(role)}.", f"{where}.role")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise bad_request(f"'{where}.content' must be a string or a list of content blocks.", f"{where}.content")
        made = _assistant(blocks, where) if role == "assistant" else _user(blocks, where, calls)
        for turn in made:
            calls.update(call["id"] for call in turn.get("tool_calls", ()))
        turns.extend(made)
    return turns


def _assistant(blocks: list, where: str) -> list[Turn]:
    text, reasoning, calls = [], [], []
    for i, block in enumerate(blocks):
        at, kind = f"{where}.content[{i}]", _kind(block, f"{where}.content[{i}]")
        if kind == "text":
            text.append(_string(block, "text", at))
        elif kind == "thinking":
            reasoning.append(_string(block, "thinking", at))
        elif kind == "tool_use":
            name, call_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not isinstance(call_id, str) or not call_id:
                raise bad_request(f"'{at}' must be a tool_use block with an 'id', a 'name' and an 'input'.", at)
            args = checked_tools.arguments(block.get("input", {}), f"{at}.input")
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
        elif kind != "redacted_thinking":
            raise bad_request(f"'{at}' is a {kind} block, which an assistant message cannot hold here.", f"{at}.type")
    turn: Turn = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        turn["reasoning_content"] = "\n".join(reasoning)
    if calls:
        turn["tool_calls"] = calls
    return [turn]


def _user(blocks: list, where: str, calls: set[str]) -> list[Turn]:
    """The user's tool results as tool turns, then the user's text and images as one user turn."""
    results: list[Turn] = []
    parts: list[dict] = []
    for i, block in enumerate(blocks):
        at, kind = f"{where}.content[{i}]", _kind(block, f"{where}.content[{i}]")
        if kind == "text":
            parts.append({"type": "text", "text": _string(block, "text", at)})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise bad_request(
                    f"'{at}.tool_use_id' is {shown(call_id)}, which answers no tool_use an earlier assistant "
                    "message made.",
                    f"{at}.tool_use_id",
                )
            output = content_parts(block.get("content", ""), f"{at}.content", ("text",), _image_or_none, RESULT_SHAPE)
            if block.get("is_error") is True:
                output = (
                    f"Error: {output}" if isinstance(output, str) else [{"type": "text", "text": "Error: "}, *output]
                )
            results.append({"role": "tool", "content": output, "tool_call_id": call_id})
        elif kind in UNSUPPORTED:
            raise bad_request(f"'{at}' is a {kind} block: only text is supported here for now.", f"{at}.type")
        else:
            raise bad_request(f"'{at}' is a {kind} block, which a user message cannot hold here.", f"{at}.type")
    if not parts and results:
        return results
    images = any(part["type"] == "image" for part in parts)
    return [*results, {"role": "user", "content": parts if images else "".join(p["text"] for p in parts)}]


RESULT_SHAPE = 'text and image blocks ({"type": "text", "text": ...}, {"type": "image", "source": ...})'


def _image(block: Mapping, at: str) -> dict:
    """An `image` block as a turn's image part: its source base64 data (with its media type) or a URL."""
    source = block.get("source")
    if not isinstance(source, Mapping):
        source = {}
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise bad_request(
                f"'{at}.source' must hold the image's 'media_type' and its base64 'data'.", f"{at}.source"
            )
        return source_part(f"data:{media};base64,{data}", f"{at}.source.data")
    if kind == "url":
        return source_part(source.get("url"), f"{at}.source.url")
    if kind == "file":
        raise bad_request(
            f"'{at}.source' names a file_id: this server keeps no files; send the image as base64 data.", f"{at}.source"
        )
    raise bad_request(
        f"'{at}.source' must be an image block's source: "
        '{"type": "base64", "media_type": "image/png", "data": ...} or {"type": "url", "url": ...}.',
        f"{at}.source",
    )


def _image_or_none(block: Mapping, at: str) -> dict | None:
    return _image(block, at) if block.get("type") == "image" else None


def _kind(block, at: str) -> str:
    kind = block.get("type") if isinstance(block, Mapping) else None
    if not isinstance(kind, str):
        raise bad_request(f"'{at}' must be a content block with a 'type'.", at)
    return kind


def _string(block: Mapping, field: str, at: str) -> str:
    value = block.get(field)
    if not isinstance(value, str):
        raise bad_request(f"'{at}.{field}' must be a string.", f"{at}.{field}")
    return value


def _thinking(body: Mapping, max_tokens: int | None) -> bool:
    thinking = optional(body, "thinking", Mapping)
    if thinking is None:
        return False
    kind = thinking.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise bad_request("'thinking.type' must be enabled, disabled or adaptive.", "thinking.type")
    if kind == "enabled" and "budget_tokens" in thinking:
        _check_budget(thinking["budget_tokens"], max_tokens)
    return kind != "disabled"


def _check_budget(budget, max_tokens: int | None) -> None:
    """`thinking.budget_tokens` as Anthropic's API takes it: a whole number of at least MIN_THINKING_BUDGET, below
    `max_tokens` (the thinking is part of the answer). The engine does not cut thinking at it."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
        raise bad_request(
            f"'thinking.budget_tokens' must be a whole number of at least {MIN_THINKING_BUDGET}; got {shown(budget)}.",
            "thinking.budget_tokens",
        )
    if max_tokens is not None and budget >= max_tokens:
        raise bad_request(
            f"'max_tokens' must be greater than 'thinking.budget_tokens' ({budget}): the thinking is part of the "
            f"answer; got max_tokens {max_tokens}.",
            "thinking.budget_tokens",
        )


def _tool(tool, where: str) -> ToolSpec | None:
    if not isinstance(tool, Mapping):
        raise bad_request(f"'{where}' must be a tool ({{name, description, input_schema}}).", where)
    if tool.get("type", "custom") != "custom":
        return None  # a server tool (web search, code execution, ...): refused, as nothing runs it here
    return checked_tools.spec(tool.get("name"), tool.get("description"), tool.get("input_schema"), where)


def _tool_use(body: Mapping) -> ToolUse | None:
    specs = checked_tools.specs(body, "custom tools", _tool)
    choice = optional(body, "tool_choice", Mapping) or {}
    kind = choice.get("type", "auto")
    if kind not in ("auto", "any", "tool", "none"):
        raise bad_request(f"'tool_choice.type' must be auto, any, tool or none; got {shown(kind)}.", "tool_choice.type")
    if kind == "tool" and not isinstance(choice.get("name"), str):
        raise bad_request("'tool_choice.name' must name the tool to call.", "tool_choice.name")
    named = {"any": "required", "tool": choice.get("name")}.get(kind, kind)
    parallel = not choice.get("disable_parallel_tool_use", False)
    return checked_tools.tool_use(specs, named, parallel, "tool_choice")


# writing


def error_body(error: ApiError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def _usage(end: StreamEnd, prompt_tokens: int) -> dict:
    stats = end.stats
    reused = stats.reused_tokens if stats is not None else 0
    return {
        "input_tokens": prompt_tokens - reused,
        "cache_read_input_tokens": reused,
        "cache_creation_input_tokens": 0,
        "output_tokens": stats.new_tokens if stats is not None else 0,
    }


def stop_reason(end: StreamEnd) -> str:
    if end.tool_calls:
        return "tool_use"
    if end.stop_text is not None:
        return "stop_sequence"
    return STOP_REASONS.get(end.reason, "end_turn")


def tool_use_id(call: ToolCall) -> str:
    """Anthropic's ids read `toolu_...`; the same call keeps the same id in both dialects."""
    return "toolu_" + call.id.removeprefix("call_")


def _tool_block(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": call.args()}


class MessagesWriter:
    """One answer of /v1/messages: a message, or Anthropic's event stream (content blocks opened, filled and
    stopped in order: thinking, text, then each tool call)."""

    route = "messages"

    def __init__(self, model: str, spec_tokens: int, prompt_tokens: int) -> None:
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.model, self.spec_tokens, self.prompt_tokens = model, spec_tokens, prompt_tokens
        self.index = -1  # the content block being written
        self.open: str | None = None  # its type

    def _message(self, content: list, stop: str | None, stop_sequence: str | None, usage: dict) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }

    def whole(self, end: StreamEnd) -> dict:
        content: list[dict] = []
        if end.thinking:
            content.append({"type": "thinking", "thinking": end.thinking, "signature": ""})
        if end.answer or not end.tool_calls:
            content.append({"type": "text", "text": end.answer})
        content += [_tool_block(call) for call in end.tool_calls]
        body = self._message(content, stop_reason(end), end.stop_text, _usage(end, self.prompt_tokens))
        return body | _figures(end, self.spec_tokens)

    def opening(self) -> list[str]:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        start = {"type": "message_start", "message": self._message([], None, None, usage)}
        return [sse(start, "message_start"), sse({"type": "ping"}, "ping")]

    def chunk(self, chunk: StreamChunk) -> list[str]:
        events: list[str] = []
        if chunk.thinking:
            events += self._into("thinking", {"type": "thinking", "thinking": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": chunk.thinking}))
        if chunk.answer:
            events += self._into("text", {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": chunk.answer}))
        for call in chunk.tool_calls:
            events += self._into("tool_use", {**_tool_block(call), "input": {}}, always=True)
            events.append(self._delta({"type": "input_json_delta", "partial_json": json.dumps(call.args())}))
        return events

    def _into(self, kind: str, block: dict, always: bool = False) -> list[str]:
        """Events that close the open block and open a `kind` one (nothing when it is open already)."""
        if self.open == kind and not always:
            return []
        events = self._stop()
        self.index += 1
        self.open = kind
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return events + [sse(start, "content_block_start")]

    def _delta(self, delta: dict) -> str:
        return sse({"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta")

    def _stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")]

    def closing(self, end: StreamEnd) -> list[str]:
        events = self._stop() if self.index >= 0 else [*self._into("text", {"type": "text", "text": ""}), *self._stop()]
        delta = {"stop_reason": stop_reason(end), "stop_sequence": end.stop_text}
        message_delta = {"type": "message_delta", "delta": delta, "usage": _usage(end, self.prompt_tokens)}
        message_delta |= _figures(end, self.spec_tokens)
        return events + [sse(message_delta, "message_delta"), sse({"type": "message_stop"}, "message_stop")]

    def failure(self, message: str, kind: str, code: str | None) -> list[str]:
        error = {"type": KIND_TYPES.get(kind, "invalid_request_error"), "message": message}
        return [sse({"type": "error", "error": error}, "error")]

    def ping(self) -> list[str]:
        return [sse({"type": "ping"}, "ping")]

    def cut(self) -> None:
        pass  # this dialect keeps no answers


def _figures(end: StreamEnd, spec_tokens: int) -> dict:
    """The engine's figures beside the answer (`metrics`, `timings`), as in every dialect: clients ignore them."""
    return figures(end.stats, spec_tokens) if end.stats is not None else {}
