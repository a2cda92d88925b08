"""What the model's lifecycle and an answer report, as data: the one list of event kinds.

Worker threads post these (chat/loader.py while a model is chosen, fetched and loaded; a backend
while it answers); whoever owns the loader applies each on its own thread and shows it: the chat
screen turns each kind into a Textual message of its own (ui/messages.py), `serve` and `run` print
them (chat/terminal_load.py). An answer's text arrives as bridge.StreamChunk, posted as it is.
`Status` is where a model stands now, for whoever words it (ui/status_text.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dflash_chat.chat.bridge import StreamChunk, StreamEnd
from dflash_chat.chat.model_source import ModelSource, Pick
from dflash_chat.chat.prompt import Prompt, Transcript

if TYPE_CHECKING:
    from dflash_chat.chat.conversation import Conversation
    from dflash_chat.chat.endpoint import Endpoint, ServedModel
    from dflash_chat.chat.model_manager import Chosen
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.hardware import Choice
    from dflash_chat.hub import Plan

# loading a model (chat/loader.py), or connecting to a server (chat/backends/remote.py)


@dataclass(frozen=True)
class ModelChosen:
    """The model manager's choice, before any file is fetched."""

    request: Pick
    chosen: Chosen


@dataclass(frozen=True)
class DownloadNeeded:
    """Files of the choice are missing: `plan` says which; the owner fetches them, then calls `downloaded`."""

    request: Pick
    choice: Choice
    plan: Plan


@dataclass(frozen=True)
class ModelReady:
    """Every file is on disk: `source` can load."""

    request: Pick
    source: ModelSource


@dataclass(frozen=True)
class ModelUnavailable:
    """No model can run yet (offline, nothing fits, unreachable server): `error` says what to do."""

    request: Pick | Endpoint
    error: str


@dataclass(frozen=True)
class LoadProgress:
    """Weights placed on the device so far, `seconds` after loading began."""

    source: ModelSource
    done: int
    total: int
    seconds: float


@dataclass(frozen=True)
class ModelLoaded:
    """`model` is ready to answer: a loaded pair, or the model a server answers with."""

    source: ModelSource | Endpoint
    model: LoadedPair | ServedModel
    seconds: float


@dataclass(frozen=True)
class ModelFailed:
    source: ModelSource
    error: str
    cause: BaseException | None = field(default=None, compare=False)  # `run` raises it again, as before


LoadEvent = ModelChosen | DownloadNeeded | ModelReady | ModelUnavailable | LoadProgress | ModelLoaded | ModelFailed

# writing an answer (chat/backends/)


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
BackendEvent = LoadEvent | AnswerEvent


# where a model stands


Stage = Literal[
    "idle",  # nothing asked for yet
    "choosing",  # the model manager probes the machine
    "checking",  # it chose; the files are being looked up
    "downloading",
    "not_downloaded",  # the download stopped; `advice` says how to resume
    "loading",
    "connecting",  # a server: `what` is its host
    "ready",
    "unavailable",  # no model can run yet: `error`
    "failed",  # the model did not load: `error`
]


@dataclass(frozen=True)
class Status:
    stage: Stage = "idle"
    explanation: str = ""  # the model manager's reason for its choice, once it chose
    what: str = ""  # the model (or server) being fetched, loaded or connected to, named for a person
    size: int = 0  # bytes still to download
    error: str = ""
    advice: str = ""
    demo: bool = False  # the tiny built-in demo pair
