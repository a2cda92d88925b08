"""The one seam between the chat screen and whatever answers: a model in this process, or a server.

A backend owns the model's lifecycle (choose, fetch, load, or connect), the session that answers, and
what a next prompt may reuse. Its blocking work runs as worker bodies with no UI code, started through
`spawn(body, group)` and reporting through `post(event)` (the events below: plain dataclasses, no
Textual), exactly as chat/bridge.py does for one answer. The screen wraps each event in a Textual
message; on the UI thread it first hands the event back to `handle`, which applies it to the
backend's state and says whether it is still current (a worker cannot be stopped: one started for an
earlier request or model may still post). Then the screen renders it. Two backends exist:
chat/local_backend.py (the engine in this process; `serve` runs the same one) and chat/remote.py (an
OpenAI-compatible server: `dflash-chat --endpoint URL`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflash_chat.chat.bridge import StreamChunk, StreamEnd
from dflash_chat.chat.prompt import Prompt, Transcript

Post = Callable[[object], None]
Spawn = Callable[[Callable[[], None], str], None]  # (worker body, group: "model" | "generate")


# events a backend posts (from worker threads)


@dataclass(frozen=True)
class ModelChosen:
    """The model manager's choice (chat.model_manager.Chosen), before any file is fetched."""

    request: Any
    chosen: Any


@dataclass(frozen=True)
class DownloadNeeded:
    """Files of the choice are missing: `plan` (hub.Plan) says which; the screen fetches them."""

    request: Any
    choice: Any
    plan: Any


@dataclass(frozen=True)
class ModelReady:
    """Every file is on disk: `source` (a ModelSource) can load."""

    request: Any
    source: Any


@dataclass(frozen=True)
class ModelUnavailable:
    """No model can run yet (offline, nothing fits, unreachable server): `error` says what to do."""

    request: Any
    error: str


@dataclass(frozen=True)
class LoadProgress:
    """Weights placed on the device so far, `seconds` after loading began."""

    source: Any
    done: int
    total: int
    seconds: float


@dataclass(frozen=True)
class ModelLoaded:
    """`model` is ready to answer (a LoadedPair, or a remote.ServedModel)."""

    source: Any
    model: Any
    seconds: float


@dataclass(frozen=True)
class ModelFailed:
    source: Any
    error: str


@dataclass(frozen=True)
class PromptSent:
    """The exact prompt the engine got for the answer being written."""

    prompt: Prompt


@dataclass(frozen=True)
class AnswerChunk:
    chunk: StreamChunk


@dataclass(frozen=True)
class AnswerEnded:
    """The answer is over; `transcript`: what the engine now holds (None after an error, or remote);
    `model`: what wrote it (it may no longer be the backend's)."""

    end: StreamEnd
    transcript: Transcript | None = None
    model: Any = None
    chat: Any = None  # the Conversation it answers


@dataclass(frozen=True)
class AnswerRequest:
    """One answer to write: the chat so far, and the settings it is written with."""

    chat: Any  # the Conversation it answers (transcripts are kept per chat)
    turns: list[dict[str, str]]
    thinking: bool
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    cancel: threading.Event
    draft: str | int = "auto"  # drafts per step, for a local engine (the draft setting)


class Backend:
    """What the chat screen asks of a model; see the module text."""

    post: Post
    spawn: Spawn
    remote = False  # a server answers: figures come from what it reports
    request: Any = None  # what to begin with when the screen mounts
    subtitle = ""  # the title bar's model line
    panel_note = ""  # the panel's Model section while nothing answers

    def attach(self, post: Post, spawn: Spawn) -> None:
        self.post, self.spawn = post, spawn

    # state the screen reads

    @property
    def model(self) -> Any:
        """What answers (None until one is ready)."""
        raise NotImplementedError

    @property
    def speculative(self) -> bool:
        """Whether live draft figures exist while an answer streams."""
        return False

    @property
    def note(self) -> str:
        """What the backend is doing (choosing, loading...) or why nothing runs; '' when ready."""
        return ""

    def name(self) -> str:
        """The model's name for the title bar."""
        raise NotImplementedError

    def ready_text(self, seconds: float) -> str:
        """The notification once a model is ready."""
        return f"{self.name()} is ready ({seconds:.1f} s to load)"

    def rows(self) -> tuple[tuple[str, str], ...]:
        """The panel's Model section."""
        raise NotImplementedError

    def no_model_yet(self) -> str:
        """Why a message cannot be sent yet, in one line."""
        return self.note.splitlines()[-1] if self.note else "No model is ready yet."

    # lifecycle

    def begin(self, request: Any) -> None:
        raise NotImplementedError

    def handle(self, event: object) -> bool:
        """Apply a posted event to this backend (UI thread); False when it is stale."""
        raise NotImplementedError

    def answer(self, request: AnswerRequest) -> None:
        """Start writing an answer: PromptSent?, AnswerChunk..., then AnswerEnded, all through `post`."""
        raise NotImplementedError

    def stop(self, request: AnswerRequest) -> None:
        """Stop writing that answer (Esc): what was written is kept, AnswerEnded follows."""
        request.cancel.set()

    def close(self) -> None:
        """The app quits: stop posting, and let every worker waiting on this backend return now."""

    def open_chat(self, chat: Any) -> None:
        """`chat` (a Conversation) is now the open one: a new chat, or a saved one opened again."""
