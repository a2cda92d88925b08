"""The answering service: a loaded pair's engine session, and what the engine holds of each chat.

The engine keeps the tokens of its last answer and prefills only what a new prompt adds to them
(engine/spec.py). Which chat those tokens are is kept here, by a key the caller picks: the chat screen
keys each chat (so a chat opened again still starts with them), `serve` one key for every client (the
engine holds one sequence, whoever asked). The next prompt of that chat is then built to start with
them (runtime/prompt.py: next_prompt). Both answer through runtime/session.py.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from dflash_chat.runtime.session import EngineSession

if TYPE_CHECKING:
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.runtime.bridge import StreamEnd
    from dflash_chat.runtime.prompt import Prompt, Transcript


class AnsweringService:
    def __init__(self, session: EngineSession) -> None:
        self.session = session
        self._held: dict[Hashable, Transcript] = {}

    @classmethod
    def of(cls, pair: LoadedPair) -> AnsweringService:
        return cls(EngineSession(pair))

    @property
    def pair(self) -> LoadedPair:
        return self.session.pair

    def held(self, chat: Hashable) -> Transcript | None:
        """What the engine holds of `chat`, when its last answer is what the engine holds."""
        return self._held.get(chat)

    @property
    def chats(self) -> dict[Hashable, Transcript]:
        return dict(self._held)

    def chat_prompt(self, chat: Hashable, turns: list[dict[str, str]], thinking: bool) -> Prompt:
        """The prompt for the next answer of `chat`, starting with what the engine holds of it."""
        return self.session.chat_prompt(turns, thinking, self.held(chat))

    def answered(self, chat: Hashable, turns: list[dict[str, str]], prompt: Prompt, end: StreamEnd) -> None:
        """`chat`'s answer to `prompt` ended: the engine now holds it (or nothing a next prompt can use)."""
        self.keep(chat, self.session.held(turns, prompt, end))

    def keep(self, chat: Hashable, transcript: Transcript | None) -> None:
        if transcript is None:
            self._held.pop(chat, None)
        else:
            self._held[chat] = transcript
