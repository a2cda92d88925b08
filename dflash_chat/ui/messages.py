"""One Textual message per kind of backend event (chat/events.py), posted from worker threads.

A backend posts plain event data through a `post` callback (post_message never blocks the worker);
`message_for` gives each event its own message, so Textual delivers it on the UI thread to the chat
screen's handler of that kind (`on_model_loaded`, `on_answer_chunk`...). Each carries its event as
`event`, typed: a stream chunk is wrapped once, here.
"""

from __future__ import annotations

from textual.message import Message

from dflash_chat.chat import events
from dflash_chat.chat.bridge import StreamChunk


class ModelChosen(Message):
    def __init__(self, event: events.ModelChosen) -> None:
        super().__init__()
        self.event = event


class DownloadNeeded(Message):
    def __init__(self, event: events.DownloadNeeded) -> None:
        super().__init__()
        self.event = event


class ModelReady(Message):
    def __init__(self, event: events.ModelReady) -> None:
        super().__init__()
        self.event = event


class ModelUnavailable(Message):
    def __init__(self, event: events.ModelUnavailable) -> None:
        super().__init__()
        self.event = event


class LoadProgress(Message):
    def __init__(self, event: events.LoadProgress) -> None:
        super().__init__()
        self.event = event


class ModelLoaded(Message):
    def __init__(self, event: events.ModelLoaded) -> None:
        super().__init__()
        self.event = event


class ModelFailed(Message):
    def __init__(self, event: events.ModelFailed) -> None:
        super().__init__()
        self.event = event


class PromptSent(Message):
    def __init__(self, event: events.PromptSent) -> None:
        super().__init__()
        self.event = event


class AnswerChunk(Message):
    def __init__(self, event: StreamChunk) -> None:
        super().__init__()
        self.event = event


class AnswerEnded(Message):
    def __init__(self, event: events.AnswerEnded) -> None:
        super().__init__()
        self.event = event


def message_for(event: events.BackendEvent) -> Message:
    """The message that carries `event` to its handler."""
    match event:
        case StreamChunk():
            return AnswerChunk(event)
        case events.PromptSent():
            return PromptSent(event)
        case events.AnswerEnded():
            return AnswerEnded(event)
        case events.ModelChosen():
            return ModelChosen(event)
        case events.DownloadNeeded():
            return DownloadNeeded(event)
        case events.ModelReady():
            return ModelReady(event)
        case events.ModelUnavailable():
            return ModelUnavailable(event)
        case events.LoadProgress():
            return LoadProgress(event)
        case events.ModelLoaded():
            return ModelLoaded(event)
        case events.ModelFailed():
            return ModelFailed(event)
    raise TypeError(f"not a backend event: {event!r}")
