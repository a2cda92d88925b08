"""What a model's lifecycle reports, as data: the one list of loading event kinds, and `Status`.

Worker threads post these (runtime/loader.py while a model is chosen, fetched and loaded; a remote
backend while it connects); whoever owns the loader applies each on its own thread and shows it: the
chat screen turns each kind into a Textual message of its own (ui/messages.py), `serve` and `run` print
them (runtime/terminal_load.py). `Status` is where a model stands now, for whoever words it
(ui/status_text.py). An answer's events are chat/events.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dflash_chat.runtime.model_source import ModelSource, Pick

if TYPE_CHECKING:
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.models.hardware import Choice
    from dflash_chat.models.hub import Plan
    from dflash_chat.runtime.endpoint import Endpoint, ServedModel
    from dflash_chat.runtime.model_manager import Chosen

# loading a model (runtime/loader.py), or connecting to a server (chat/backends/remote.py)


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
