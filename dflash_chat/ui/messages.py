"""One Textual message per kind of backend event (runtime/events.py, chat/events.py), tool event (the
servers' state, the agent loop's workers) and image read for the next message (chat/attach.py), posted from
worker threads.

A backend posts plain event data through a `post` callback (post_message never blocks the worker);
`message_for` gives each event its own message, so Textual delivers it on the UI thread to the chat
screen's handler of that kind (`on_model_loaded`, `on_answer_chunk`...). Each carries its event as
`event`, typed: a stream chunk is wrapped once, here.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from dflash_chat.chat import agent, attach
from dflash_chat.chat import events as answer_events
from dflash_chat.chat.backends.base import BackendEvent
from dflash_chat.chat.tools.servers import ServerChanged
from dflash_chat.runtime import events
from dflash_chat.runtime.bridge import StreamChunk


@dataclass
class ModelChosen(Message):
    event: events.ModelChosen


@dataclass
class DownloadNeeded(Message):
    event: events.DownloadNeeded


@dataclass
class ModelReady(Message):
    event: events.ModelReady


@dataclass
class ModelUnavailable(Message):
    event: events.ModelUnavailable


@dataclass
class LoadProgress(Message):
    event: events.LoadProgress


@dataclass
class ModelLoaded(Message):
    event: events.ModelLoaded


@dataclass
class ModelFailed(Message):
    event: events.ModelFailed


@dataclass
class PromptSent(Message):
    event: answer_events.PromptSent


@dataclass
class AnswerChunk(Message):
    event: StreamChunk


@dataclass
class AnswerEnded(Message):
    event: answer_events.AnswerEnded


@dataclass
class ToolServerChanged(Message):
    event: ServerChanged


@dataclass
class ServersWaited(Message):
    event: agent.ServersWaited


@dataclass
class ToolCallDone(Message):
    event: agent.ToolCallDone


@dataclass
class ImageAttached(Message):
    event: attach.ImageAttached


@dataclass
class ImageRefused(Message):
    event: attach.ImageRefused


MESSAGES: dict[type, type[Message]] = {
    StreamChunk: AnswerChunk,
    answer_events.PromptSent: PromptSent,
    answer_events.AnswerEnded: AnswerEnded,
    events.ModelChosen: ModelChosen,
    events.DownloadNeeded: DownloadNeeded,
    events.ModelReady: ModelReady,
    events.ModelUnavailable: ModelUnavailable,
    events.LoadProgress: LoadProgress,
    events.ModelLoaded: ModelLoaded,
    events.ModelFailed: ModelFailed,
    ServerChanged: ToolServerChanged,
    agent.ServersWaited: ServersWaited,
    agent.ToolCallDone: ToolCallDone,
    attach.ImageAttached: ImageAttached,
    attach.ImageRefused: ImageRefused,
}


def message_for(event: BackendEvent | attach.AttachEvent) -> Message:
    """The message that carries `event` to its handler."""
    kind = MESSAGES.get(type(event))
    if kind is None:
        raise TypeError(f"not a backend event: {event!r}")
    return kind(event)  # type: ignore[call-arg]  # each kind's one field is its event
