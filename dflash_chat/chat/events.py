"""What a backend reports while it writes an answer, beside the loading events (runtime/events.py), and what
the agent loop's workers report (chat/agent.py, chat/tools/servers.py).

A backend posts PromptSent, then the answer's StreamChunks (runtime/bridge.py), then AnswerEnded; the
chat screen turns each into a Textual message (ui/messages.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflash_chat.runtime.bridge import StreamChunk, StreamEnd
from dflash_chat.runtime.prompt import Prompt, Transcript

if TYPE_CHECKING:
    from dflash_chat.chat.conversation import Conversation
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.runtime.endpoint import ServedModel


@dataclass(frozen=True)
class PromptSent:
    """The exact prompt the engine got for the answer being written."""

    prompt: Prompt


@dataclass(frozen=True)
class AnswerEnded:
    """The answer is over; `transcript`: what the engine now holds (None after an error, or remote);
    `model`: what wrote it (it may no longer be the backend's); `chat`: the conversation it answers."""

    end: StreamEnd
    transcript: Transcript | None = None
    model: LoadedPair | ServedModel | None = None
    chat: Conversation | None = None


AnswerEvent = PromptSent | StreamChunk | AnswerEnded
