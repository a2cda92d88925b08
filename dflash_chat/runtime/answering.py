"""The answering service: a loaded pair's engine session, and what it keeps of each chat.

Two things per chat, by a key the caller picks: which tokens the engine holds of it, and what the `auto`
draft length has learned of it.
- The engine keeps the tokens of its last answer and prefills only what a new prompt adds to them
  (engine/spec.py). Which chat those tokens are is kept here: the chat screen keys each chat (so a chat
  opened again still starts with them), `serve` one key for every client (the engine holds one sequence,
  whoever asked). The next prompt of that chat is then built to start with them (runtime/prompt.py).
- Each conversation's `DraftMemory` (engine/draft_length.py) is kept here and handed to the engine with
  each answer, so one engine serves many chats and nothing learned of one crosses into another; a new
  one starts from the drafter's `Records`, which every chat of this service adds to.
Both the chat app and `serve` answer through runtime/session.py.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

from dflash_chat.engine.draft_length import DraftMemory, Records
from dflash_chat.runtime.session import EngineSession

if TYPE_CHECKING:
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.runtime.bridge import StreamEnd
    from dflash_chat.runtime.prompt import Prompt, Transcript, Turn
    from dflash_chat.runtime.tool_use import ToolUse

MEMORIES = 64  # conversations whose draft memory is kept (the least recently used goes first)
EARLIER = 16  # a key's earlier transcripts kept, for the conversations the engine parked (serve's one key)


class AnsweringService:
    def __init__(self, session: EngineSession) -> None:
        self.session = session
        self._held: dict[Hashable, Transcript] = {}
        self._earlier: dict[Hashable, list[Transcript]] = {}  # newest first
        self.records = Records()
        self._memories: OrderedDict[Hashable, DraftMemory] = OrderedDict()

    @classmethod
    def of(cls, pair: LoadedPair) -> AnsweringService:
        return cls(EngineSession(pair))

    @property
    def pair(self) -> LoadedPair:
        return self.session.pair

    def held(self, chat: Hashable) -> Transcript | None:
        """What the engine holds of `chat`, when its last answer is what the engine holds."""
        return self._held.get(chat)

    def candidates(self, chat: Hashable) -> list[Transcript]:
        """What the engine holds of `chat`, then the earlier transcripts under that key, newest first: under
        serve's one key for every client, the conversations the engine may have parked (engine/parked.py)."""
        held = self._held.get(chat)
        return ([held] if held is not None else []) + self._earlier.get(chat, [])

    @property
    def chats(self) -> dict[Hashable, Transcript]:
        return dict(self._held)

    def memory(self, conversation: Hashable) -> DraftMemory:
        """What `auto` has learned of `conversation` (a new one starts from the drafter's records)."""
        memory = self._memories.pop(conversation, None) or DraftMemory(self.records)
        self._memories[conversation] = memory
        while len(self._memories) > MEMORIES:
            self._memories.popitem(last=False)
        return memory

    def chat_prompt(self, chat: Hashable, turns: list[Turn], thinking: bool, tools: ToolUse | None = None) -> Prompt:
        """The prompt for the next answer of `chat`, starting with what the engine holds of it."""
        return self.session.chat_prompt(turns, thinking, self.held(chat), tools)

    def answered(self, chat: Hashable, turns: list[Turn], prompt: Prompt, end: StreamEnd) -> None:
        """`chat`'s answer to `prompt` ended: the engine now holds it (or nothing a next prompt can use)."""
        self.keep(chat, self.session.held(turns, prompt, end))

    def keep(self, chat: Hashable, transcript: Transcript | None) -> None:
        old = self._held.get(chat)
        if old is not None and (transcript is None or transcript.ids[: len(old.ids)] != old.ids):
            earlier = [old] + [t for t in self._earlier.get(chat, []) if t is not old]
            self._earlier[chat] = earlier[:EARLIER]  # another conversation took the engine: this one may be parked
        if transcript is None:
            self._held.pop(chat, None)
        else:
            self._held[chat] = transcript
