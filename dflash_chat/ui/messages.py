"""The message worker threads post to the UI (post_message: it never blocks the worker).

A backend (chat/backend.py) posts plain event dataclasses through a `post` callback; the chat screen
wraps each in a BackendEvent so Textual delivers it on the UI thread, where the backend first says
whether it is still current, then the screen renders it.
"""

from __future__ import annotations

from textual.message import Message


class BackendEvent(Message):
    def __init__(self, event: object) -> None:
        super().__init__()
        self.event = event
