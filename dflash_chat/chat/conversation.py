"""A conversation as the app holds it: plain messages, no UI and no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_chat.engine.events import GenerationStats

# How an assistant message ended. "partial" is what a crash leaves behind: the
# answer was being written when the app stopped. "cut": a remote answer that ended
# without a proper finish (the connection or the stream broke); its text is kept.
COMPLETE, PARTIAL, CANCELLED, ERROR, CUT = "complete", "partial", "cancelled", "error", "cut"


@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str = ""
    thinking: str = ""
    status: str = COMPLETE
    stats: GenerationStats | None = None
    id: int | None = None  # row id in the history store once saved
    note: str = ""  # why an answer ended early (a cut stream, an error), in words


@dataclass
class Conversation:
    title: str = "New chat"
    messages: list[Message] = field(default_factory=list)
    id: int | None = None

    def last(self, role: str) -> Message | None:
        for message in reversed(self.messages):
            if message.role == role:
                return message
        return None

    def chat_turns(self, system_prompt: str = "") -> list[dict[str, str]]:
        """The messages a chat template takes. Thinking is left out of earlier answers,
        as Qwen's templates do; answers that failed before producing text are skipped."""
        turns = [{"role": "system", "content": system_prompt}] if system_prompt else []
        for message in self.messages:
            if message.role == "assistant" and not message.content:
                continue
            turns.append({"role": message.role, "content": message.content})
        return turns


def title_from(text: str, limit: int = 48) -> str:
    """A conversation title from its first prompt: the first line, shortened on a word."""
    line = " ".join(text.strip().split("\n", 1)[0].split())
    if len(line) <= limit:
        return line or "New chat"
    cut = line[:limit].rsplit(" ", 1)[0] or line[:limit]
    return cut + "…"
