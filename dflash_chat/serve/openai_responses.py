"""OpenAI's Responses API (`POST /v1/responses`): what Codex CLI speaks.

A body is read into the internal ChatRequest: `instructions` becomes the system turn, `input` (a string,
or items: `message` with text parts, `function_call`, `function_call_output`) the turns, Responses' flat
function `tools` and `tool_choice` a ToolUse, `reasoning.effort` the thinking switch (none or minimal:
off). `previous_response_id` continues a stored response's conversation, kept in memory only
(serve/response_store.py: bounded by count and by its images' bytes, never on disk); an unknown or dropped one is a
400. Items and fields we do not use (reasoning items, `include`, `text`, `prompt_cache_key`) are accepted and ignored. Built-in tools
(`web_search`, `file_search`, Codex's `namespace` groups, ...: OpenAI's servers run them, nothing here does) are
left out, of the prompt and of the `tools` the response says it took: Codex sends some with every request.
A user message's `input_image` parts (and a function_call_output's) are the turn's images, by a data URL or, with
--allow-image-urls, an http(s) URL (serve/images.py); a `file_id` is a 400 (this server keeps no files).
The answer is written as a response object with `message` and `function_call` output items, and when
streamed as its typed events, each with its `sequence_number`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from dflash_chat.engine.rules import shown
from dflash_chat.runtime.bridge import StreamChunk, StreamEnd
from dflash_chat.runtime.prompt import Turn
from dflash_chat.runtime.tool_calls import ToolCall, ToolSpec
from dflash_chat.runtime.tool_use import ToolUse
from dflash_chat.serve import tools as checked_tools
from dflash_chat.serve.errors import bad_request
from dflash_chat.serve.images import source_part
from dflash_chat.serve.openai_chat import figures
from dflash_chat.serve.requests import ChatRequest, Streaming, content_parts, optional, output_format
from dflash_chat.serve.requests import sampling as checked_sampling
from dflash_chat.serve.response_store import KEPT_RESPONSES, MAX_IMAGE_BYTES
from dflash_chat.serve.writer import sse
from dflash_chat.settings import Settings

TEXT_PARTS = ("input_text", "output_text", "text")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
IGNORED_ITEMS = ("reasoning", "item_reference")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # none and minimal: thinking off

# reading


def responses_request(body: Mapping, defaults: Settings, previous: Callable[[str], list[Turn] | None]) -> ChatRequest:
    """A Responses body as the internal request; `previous(id)`: the turns of a stored response, or None."""
    turns: list[Turn] = []
    earlier = optional(body, "previous_response_id", str)
    if earlier is not None:
        kept = previous(earlier)
        if kept is None:
            raise bad_request(
                f"'previous_response_id' {shown(earlier)} is not a response this server keeps (it keeps the last "
                f"{KEPT_RESPONSES} and {MAX_IMAGE_BYTES // 2**20} MiB of their images, in memory, dropping the oldest "
                "first): send the whole conversation in 'input' instead.",
                "previous_response_id",
            )
        turns = list(kept)
    instructions = optional(body, "instructions", str)
    if instructions:
        turns = [{"role": "system", "content": instructions}] + [t for t in turns if t["role"] != "system"]
    turns += _input(body.get("input"), {c["id"] for t in turns for c in t.get("tool_calls", ())})
    if all(turn["role"] == "system" for turn in turns):
        raise bad_request(
            "'input' holds no message to answer ('reasoning' and 'item_reference' items are not read): "
            "send at least one message or function_call_output item.",
            "input",
        )
    sampling = checked_sampling(body, defaults.sampling(), "max_output_tokens", None)
    stream = optional(body, "stream", bool) or False
    text = optional(body, "text", Mapping) or {}
    return ChatRequest(
        optional(body, "model", str),
        turns,
        _thinking(body, defaults),
        sampling,
        Streaming(stream),
        _tool_use(body),
        output=output_format(text.get("format"), "text.format", "schema"),
    )


def _input(value, calls: set[str]) -> list[Turn]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty list of input items.", "input")
    turns: list[Turn] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise bad_request(f"'{where}' must be an input item object.", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad_request(
                    f"'{where}.role' must be one of {', '.join(ROLES)}; got {shown(role)}.", f"{where}.role"
                )
            turns.append(
                {"role": ROLES[role], "content": _content(item.get("content"), f"{where}.content", ROLES[role])}
            )
        elif kind == "function_call":
            call = _call(item, where)
            calls.add(call["id"])
            if turns and turns[-1]["role"] == "assistant":  # several calls of one answer: one assistant turn
                turns[-1].setdefault("tool_calls", []).append(call)
            else:
                turns.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise bad_request(
                    f"'{where}.call_id' is {shown(call_id)}, which answers no function_call before it.",
                    f"{where}.call_id",
                )
            turns.append(
                {"role": "tool", "content": _content(item.get("output"), f"{where}.output"), "tool_call_id": call_id}
            )
        elif kind not in IGNORED_ITEMS:
            raise bad_request(f"'{where}.type' {shown(kind)} is not an input item this server reads.", f"{where}.type")
    return turns


IMAGE_SHAPE = 'text and image parts ({"type": "input_text", "text": ...}, {"type": "input_image", "image_url": ...})'


def _content(content, where: str, role: str = "tool") -> str | list[dict]:
    """A message's content or a call's output: text, or (a user's, a call's output) text and images."""
    if role in ("user", "tool"):
        return content_parts(content, where, TEXT_PARTS, _image, IMAGE_SHAPE)
    return content_parts(content, where, TEXT_PARTS, partial(_no_image, role), 'text parts ({"type": "input_text"})')


def _image(part: Mapping, at: str) -> dict | None:
    """An `input_image` part by its `image_url` (a data URL, or http(s)), or None; a file id is refused."""
    if part.get("type") != "input_image":
        return None
    if part.get("image_url") is None and part.get("file_id") is not None:
        raise bad_request(
            f"'{at}' names a file_id: this server keeps no files; send the image in 'image_url' as a data URL "
            "(data:image/png;base64,...).",
            f"{at}.file_id",
        )
    return source_part(part.get("image_url"), f"{at}.image_url")


def _no_image(role: str, part: Mapping, at: str) -> None:
    if part.get("type") == "input_image":
        raise bad_request(f"'{at}' is an image in a {role} message: only user messages may hold images.", at)


def _call(item: Mapping, where: str) -> dict:
    name, call_id = item.get("name"), item.get("call_id")
    if not isinstance(name, str) or not isinstance(call_id, str) or not call_id:
        raise bad_request(f"'{where}' must be a function_call with 'call_id', 'name' and 'arguments'.", where)
    args = checked_tools.arguments(item.get("arguments", "{}"), f"{where}.arguments")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _thinking(body: Mapping, defaults: Settings) -> bool:
    reasoning = optional(body, "reasoning", Mapping)
    effort = reasoning.get("effort") if reasoning is not None else None
    if effort is None:
        return defaults.thinking
    if effort not in EFFORTS:
        raise bad_request(
            f"'reasoning.effort' must be {', '.join(EFFORTS[:-1])} or {EFFORTS[-1]}; got {shown(effort)}.",
            "reasoning.effort",
        )
    return effort not in ("none", "minimal")


def _tool(tool, where: str) -> ToolSpec | None:
    if not isinstance(tool, Mapping):
        raise bad_request(f"'{where}' must be a tool object.", where)
    if tool.get("type") != "function":
        return None  # a built-in tool (web search, file search, ...): nothing runs it here, so it is left out
    return checked_tools.spec(tool.get("name"), tool.get("description"), tool.get("parameters"), where)


def _tool_use(body: Mapping) -> ToolUse | None:
    specs = checked_tools.specs(body, "function tools", _tool, refuse_others=False)
    choice = checked_tools.openai_choice(
        body.get("tool_choice"), lambda choice: choice.get("name"), '{"type": "function", "name": ...}'
    )
    return checked_tools.tool_use(specs, choice, body.get("parallel_tool_calls", True))


# writing


def taken_tools(body: Mapping) -> list:
    """The request's tools the answer took: its function tools (built-in ones are left out, never echoed as taken)."""
    return [tool for tool in body.get("tools") or [] if isinstance(tool, Mapping) and tool.get("type") == "function"]


def answer_turn(end: StreamEnd) -> Turn:
    """The answer as a turn of the conversation, for a response a later one continues."""
    return _turn(end.answer, end.tool_calls)


def _turn(text: str, calls: Sequence[ToolCall]) -> Turn:
    turn: Turn = {"role": "assistant", "content": text}
    if calls:
        turn["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.args()}} for c in calls
        ]
    return turn


class ResponsesWriter:
    """One answer of /v1/responses: a response object, or its event stream (a message item for the text,
    a function_call item per call, each added, filled and done in order)."""

    route = "responses"

    def __init__(
        self, body: Mapping, model: str, spec_tokens: int, prompt_tokens: int, keep: Callable[[str, Turn], None]
    ) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.body, self.model, self.keep = body, model, keep
        self.spec_tokens, self.prompt_tokens = spec_tokens, prompt_tokens
        self.created = int(time.time())
        self.sequence = 0
        self.items: list[dict] = []  # output items so far, as they will stand in the response
        self.message: dict | None = None  # the message item being written
        self.calls: list[ToolCall] = []  # the calls written so far

    def _response(self, status: str, end: StreamEnd | None) -> dict:
        body = self.body
        response: dict = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": self.items,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": taken_tools(body),
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "store": body.get("store", True),
            "metadata": body.get("metadata") or {},
            "text": {"format": {"type": "text"}},
        }
        if end is not None and end.stats is not None:
            stats = end.stats
            response["usage"] = {
                "input_tokens": stats.prompt_tokens,
                "input_tokens_details": {"cached_tokens": stats.reused_tokens},
                "output_tokens": stats.new_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": stats.prompt_tokens + stats.new_tokens,
            }
            response |= figures(stats, self.spec_tokens)
            if end.reason == "length" and not end.tool_calls:
                response["status"] = "incomplete"
                response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response

    def _event(self, kind: str, **fields) -> str:
        self.sequence += 1
        return sse({"type": kind, "sequence_number": self.sequence - 1, **fields}, kind)

    def whole(self, end: StreamEnd) -> dict:
        if end.answer or not end.tool_calls:
            self.items.append(self._message_item(end.answer, "completed"))
        self.items += [_call_item(call) for call in end.tool_calls]
        self.keep(self.id, answer_turn(end))
        return self._response("completed", end)

    def opening(self) -> list[str]:
        skeleton = self._response("in_progress", None)
        return [
            self._event("response.created", response=skeleton),
            self._event("response.in_progress", response=skeleton),
        ]

    def chunk(self, chunk: StreamChunk) -> list[str]:
        events: list[str] = []
        if chunk.answer:
            if self.message is None:
                events += self._open_message()
            assert self.message is not None
            self.message["content"][0]["text"] += chunk.answer
            item_id, at = self.message["id"], len(self.items) - 1
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=item_id,
                    output_index=at,
                    content_index=0,
                    delta=chunk.answer,
                    logprobs=[],
                )
            )
        for call in chunk.tool_calls:
            events += self._close_message()
            events += self._call_events(call)
        return events

    def _open_message(self) -> list[str]:
        self.message = self._message_item("", "in_progress")
        self.items.append(self.message)
        at, part = len(self.items) - 1, {"type": "output_text", "text": "", "annotations": []}
        return [
            self._event("response.output_item.added", output_index=at, item={**self.message, "content": []}),
            self._event(
                "response.content_part.added", item_id=self.message["id"], output_index=at, content_index=0, part=part
            ),
        ]

    def _close_message(self) -> list[str]:
        if self.message is None:
            return []
        message, self.message = self.message, None
        message["status"] = "completed"
        at, part = self.items.index(message), message["content"][0]
        return [
            self._event(
                "response.output_text.done",
                item_id=message["id"],
                output_index=at,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self._event(
                "response.content_part.done", item_id=message["id"], output_index=at, content_index=0, part=part
            ),
            self._event("response.output_item.done", output_index=at, item=message),
        ]

    def _call_events(self, call: ToolCall) -> list[str]:
        self.calls.append(call)
        item = _call_item(call)
        self.items.append(item)
        at = len(self.items) - 1
        return [
            self._event(
                "response.output_item.added", output_index=at, item={**item, "arguments": "", "status": "in_progress"}
            ),
            self._event(
                "response.function_call_arguments.delta", item_id=item["id"], output_index=at, delta=call.arguments
            ),
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=at,
                name=call.name,
                arguments=call.arguments,
            ),
            self._event("response.output_item.done", output_index=at, item=item),
        ]

    def closing(self, end: StreamEnd) -> list[str]:
        events = [] if self.items else self._open_message()
        events += self._close_message()
        self.keep(self.id, answer_turn(end))
        response = self._response("completed", end)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return events + [self._event(kind, response=response)]

    def failure(self, message: str, kind: str, code: str | None) -> list[str]:
        return [self._event("error", code=code or kind, message=message, param=None)]

    def ping(self) -> list[str]:
        return []

    def cut(self) -> None:
        """Kept as far as it was written, as the chat keeps an answer cut short: continuing from its id works."""
        text = "".join(item["content"][0]["text"] for item in self.items if item["type"] == "message")
        self.keep(self.id, _turn(text, self.calls))

    def _message_item(self, text: str, status: str) -> dict:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        return {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex}",
            "status": status,
            "role": "assistant",
            "content": content,
        }


def _call_item(call: ToolCall) -> dict:
    return {
        "type": "function_call",
        "id": "fc_" + call.id.removeprefix("call_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }
