"""Messages the worker threads post to the UI (post_message: it never blocks the worker).

Model messages carry what they were started for (`source` or `request`): a worker cannot be
stopped, so one started before the settings changed may still post, and the chat screen drops
messages whose source or request is no longer its own.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from dflash_chat.chat.bridge import StreamChunk, StreamEnd
from dflash_chat.chat.prompt import Prompt, Transcript


class ModelLoaded(Message):
    def __init__(self, source: Any, pair: Any, seconds: float) -> None:
        super().__init__()
        self.source = source
        self.pair = pair
        self.seconds = seconds


class ModelFailed(Message):
    def __init__(self, source: Any, error: str) -> None:
        super().__init__()
        self.source = source
        self.error = error


class ModelChosen(Message):
    """The model manager's choice (`chosen`: chat.model_manager.Chosen), before any file is fetched."""

    def __init__(self, request: Any, chosen: Any) -> None:
        super().__init__()
        self.request = request
        self.chosen = chosen


class DownloadNeeded(Message):
    """Files of the choice are missing: `plan` (hub.Plan) says which."""

    def __init__(self, request: Any, choice: Any, plan: Any) -> None:
        super().__init__()
        self.request = request
        self.choice = choice
        self.plan = plan


class ModelReady(Message):
    """Every file is on disk: `source` (a ModelSource) can load."""

    def __init__(self, request: Any, source: Any) -> None:
        super().__init__()
        self.request = request
        self.source = source


class ModelUnavailable(Message):
    """No model can run yet (offline, nothing fits, no GPU and no demo): `error` says what to do."""

    def __init__(self, request: Any, error: str) -> None:
        super().__init__()
        self.request = request
        self.error = error


class PromptSent(Message):
    """The exact prompt the engine got for the answer being written."""

    def __init__(self, prompt: Prompt) -> None:
        super().__init__()
        self.prompt = prompt


class AnswerChunk(Message):
    def __init__(self, chunk: StreamChunk) -> None:
        super().__init__()
        self.chunk = chunk


class AnswerEnded(Message):
    """The answer is over; `transcript` is what the engine now holds (None after an error)."""

    def __init__(self, end: StreamEnd, transcript: Transcript | None = None) -> None:
        super().__init__()
        self.end = end
        self.transcript = transcript
