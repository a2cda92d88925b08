"""Saving chats as they grow: the history writes of the chat screen, and what happens when they fail.

A write that fails (read-only file, another program holding it, disk full) is said once, in words,
through `warn`, and no later write of that chat is tried: it would fail the same way, or save half a
chat. The chat goes on unsaved.
"""

from __future__ import annotations

from collections.abc import Callable

from dflash_chat.chat.conversation import Conversation, Message, title_from
from dflash_chat.chat.history import HistoryStore, HistoryUnavailable


class Recorder:
    def __init__(self, store: HistoryStore, warn: Callable[[str], None]) -> None:
        self.store = store
        self.warn = warn
        self.unsaved: list[Conversation] = []  # chats whose history writes failed (said once each)

    def _write(self, conversation: Conversation, write, *args):
        if any(c is conversation for c in self.unsaved):
            return None
        try:
            return write(*args)
        except HistoryUnavailable as exc:
            self.unsaved.append(conversation)
            self.warn(f"This chat is not being saved (you can go on chatting): {exc}.")
            return None

    def start(self, conversation: Conversation, first_prompt: str) -> None:
        """Name a new chat after its first prompt and give it a row (its id) in the history."""
        conversation.title = title_from(first_prompt)
        conversation.id = self._write(conversation, self.store.create, conversation.title, conversation.tools)

    def add(self, conversation: Conversation, message: Message) -> None:
        self._write(conversation, self.store.add, conversation.id, message)

    def update(self, conversation: Conversation, message: Message) -> None:
        self._write(conversation, self.store.update, message)

    def remove(self, conversation: Conversation, message: Message) -> None:
        if message.id is not None:
            self._write(conversation, self.store.remove_message, message.id)

    def save_tools(self, conversation: Conversation) -> None:
        """The chat's choice of tools (a chat not saved yet gets it when it is: `start`)."""
        if conversation.id is not None:
            self._write(conversation, self.store.set_tools, conversation.id, conversation.tools)
