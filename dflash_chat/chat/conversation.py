"""A conversation as the app holds it: plain messages, no UI and no torch.

A user message may hold images (`images`: chat/images.py attachments, the bytes stored by content hash); its turn
is then a content of parts, the images before the text, as Qwen's template and OpenAI's API take them.

An answer may call tools: its `tool_calls`, each answered by a later "tool" message (`tool_call_id`) that
holds the result as the model reads it (chat/tools/results.py) and how the call went (`status`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dflash_chat.chat.images import Attachment
from dflash_chat.chat.tools.choice import ChatTools
from dflash_chat.engine.events import GenerationStats
from dflash_chat.runtime.tool_calls import ToolCall

# How an assistant message ended. "partial" is what a crash leaves behind: the
# answer was being written when the app stopped. "cut": a remote answer that ended
# without a proper finish (the connection or the stream broke); its text is kept.
COMPLETE, PARTIAL, CANCELLED, ERROR, CUT = "complete", "partial", "cancelled", "error", "cut"
# How a tool call went, beside COMPLETE (it answered), ERROR (it failed) and CANCELLED (Esc): it ran out of
# time, the user said no, or the message had used its rounds of tool calls.
TIMEOUT, DENIED, SKIPPED = "timeout", "denied", "skipped"


@dataclass
class Message:
    role: str  # "user" | "assistant" | "tool"
    content: str = ""
    thinking: str = ""
    status: str = COMPLETE
    stats: GenerationStats | None = None
    id: int | None = None  # row id in the history store once saved
    note: str = ""  # why an answer ended early (a cut stream, an error), in words
    tool_calls: tuple[ToolCall, ...] = ()  # an answer's calls
    tool_call_id: str = ""  # a tool message: the call it answers
    images: tuple[Attachment, ...] = ()  # a user message's images, in the order they were attached


@dataclass
class Conversation:
    title: str = "New chat"
    messages: list[Message] = field(default_factory=list)
    id: int | None = None
    tools: ChatTools = field(default_factory=ChatTools)  # which tools it offers (saved with it)

    def last(self, role: str) -> Message | None:
        for message in reversed(self.messages):
            if message.role == role:
                return message
        return None

    def result(self, call_id: str) -> Message | None:
        """The tool message that answers call `call_id`, if there is one yet."""
        return next((m for m in self.messages if m.role == "tool" and m.tool_call_id == call_id), None)

    def chat_turns(self, system_prompt: str = "", *, images: bool = True) -> list[dict[str, Any]]:
        """The messages a chat template takes. Thinking is left out of earlier answers,
        as Qwen's templates do; answers that failed before producing text (or a call) are skipped.
        A call's arguments are a mapping, as templates take them (remote.py sends them as JSON text).
        A message's images are parts holding their Attachment (the answer's worker puts the image in its place);
        `images` False (a model that reads none): a line in the text names each, so the chat goes on."""
        turns: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        for message in self.messages:
            if message.role == "assistant" and not message.content and not message.tool_calls:
                continue
            turn: dict[str, Any] = {"role": message.role, "content": _content(message, images)}
            if message.tool_calls:
                turn["tool_calls"] = [_call_turn(call) for call in message.tool_calls]
            if message.role == "tool":
                turn["tool_call_id"] = message.tool_call_id
            turns.append(turn)
        return turns


def _content(message: Message, images: bool) -> str | list[dict[str, Any]]:
    if not message.images:
        return message.content
    if not images:
        unseen = "".join(
            f"[image {image.reference()}: not shown, this model reads no images]\n" for image in message.images
        )
        return unseen + message.content
    parts: list[dict[str, Any]] = [{"type": "image", "image": image} for image in message.images]
    return parts + [{"type": "text", "text": message.content}] if message.content else parts


def _call_turn(call: ToolCall) -> dict[str, Any]:
    """A call as a template turn holds it (and as serve's requests.py makes it from a request)."""
    try:
        arguments = json.loads(call.arguments)
    except (ValueError, RecursionError):
        arguments = None
    arguments = arguments if isinstance(arguments, dict) else {}  # its tool message says they were not an object
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def title_from(text: str, limit: int = 48) -> str:
    """A conversation title from its first prompt: the first line, shortened on a word."""
    line = " ".join(text.strip().split("\n", 1)[0].split())
    if len(line) <= limit:
        return line or "New chat"
    cut = line[:limit].rsplit(" ", 1)[0] or line[:limit]
    return cut + "…"
