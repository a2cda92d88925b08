"""The one seam between the chat screen and whatever answers: a model in this process, or a server.

A backend owns what answers (a model it chooses, fetches and loads, or a server it connects to) and
what a next prompt may reuse. Its blocking work runs as worker bodies with no UI code, started through
`spawn(body, group)` and reporting through `post(event)` (runtime/events.py: plain data, no Textual),
exactly as runtime/bridge.py does for one answer. On the UI thread the screen first hands each loading
event back to `handle`, which applies it and says whether it is still current (a worker cannot be
stopped: one started for an earlier request or model may still post); then it shows it, worded from
`status` (ui/status_text.py). Two backends: local.py (the engine in this process) and remote.py (an
OpenAI-compatible server: `dflash-chat --endpoint URL`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_chat.chat.agent import ServersWaited, ToolCallDone
from dflash_chat.chat.events import AnswerEnded, AnswerEvent
from dflash_chat.chat.tools.servers import ServerChanged
from dflash_chat.runtime.events import LoadEvent, Status

if TYPE_CHECKING:
    from dflash_chat.chat.conversation import Conversation
    from dflash_chat.chat.images import ImageStore
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.models.hardware import Choice
    from dflash_chat.models.hub import ModelFiles
    from dflash_chat.runtime.endpoint import Endpoint, ServedModel
    from dflash_chat.runtime.model_source import ModelSource, Pick
    from dflash_chat.runtime.tool_use import ToolUse
    from dflash_chat.settings import Settings

BackendEvent = LoadEvent | AnswerEvent | ServerChanged | ServersWaited | ToolCallDone  # what a backend posts
Post = Callable[[BackendEvent], None]
Spawn = Callable[[Callable[[], None], str], None]  # (worker body, group: "model" | "generate")


@dataclass(frozen=True)
class AnswerRequest:
    """One answer to write: the chat so far, and the settings it is written with."""

    chat: Conversation  # the Conversation it answers (what the engine holds is kept per chat)
    turns: list[dict[str, Any]]  # Conversation.chat_turns: tool calls' arguments as mappings
    thinking: bool
    sampling: SamplingParams  # the settings' (Settings.sampling), as the engine gets it
    cancel: threading.Event
    draft: str | int = "auto"  # drafts per step, for a local engine (the draft setting)
    speculate: str = "auto"  # which method drafts, for a local engine (the speculate setting)
    tools: ToolUse | None = None  # the tools the answer may call (their calls come back in StreamEnd.tool_calls)
    images: ImageStore | None = None  # where the turns' images are (their parts hold chat/images.py Attachments)


class Backend:
    """What the chat screen asks of a model; see the module text."""

    post: Post
    spawn: Spawn
    remote = False  # a server answers: figures come from what it reports
    request: ModelSource | Pick | Endpoint | None = None  # what `begin` starts on (None: nothing asked for)

    def attach(self, post: Post, spawn: Spawn) -> None:
        self.post, self.spawn = post, spawn

    # state the screen reads

    @property
    def model(self) -> LoadedPair | ServedModel | None:
        """What answers (None until one is ready)."""
        raise NotImplementedError

    @property
    def speculative(self) -> bool:
        """Whether live draft figures exist while an answer streams."""
        return False

    @property
    def status(self) -> Status:
        raise NotImplementedError

    def name(self) -> str:
        """The model's name for the title bar."""
        raise NotImplementedError

    def rows(self) -> tuple[tuple[str, str], ...]:
        """The panel's Model section."""
        raise NotImplementedError

    # lifecycle (UI thread)

    def begin(self) -> None:
        """Start on what was asked for (the flags or settings): choose, fetch and load, or connect."""
        raise NotImplementedError

    def apply_settings(self, settings: Settings) -> bool:
        """The settings changed; True when the model is chosen or loaded afresh for them (the answer being
        written comes from the model dropped). A model setting that names nothing usable: UserError."""
        return False

    def handle(self, event: LoadEvent) -> bool:
        """Apply a posted loading event to this backend; False when it is stale."""
        raise NotImplementedError

    def downloaded(self, request: Pick, choice: Choice, files: ModelFiles | None) -> None:
        """After the download screen (a DownloadNeeded): load what it fetched; None: it stopped."""

    def images_refused(self) -> str:
        """Why the model cannot be sent images, in one line that says what to do; '' when it can (or cannot be known
        yet: nothing loaded, or a server, which answers for itself)."""
        return ""

    def answer(self, request: AnswerRequest) -> None:
        """Start writing an answer: PromptSent?, StreamChunk..., then AnswerEnded, all through `post`."""
        raise NotImplementedError

    def answer_ended(self, event: AnswerEnded) -> None:
        """An answer is over (UI thread): keep what the engine holds of its chat."""

    def stop(self, request: AnswerRequest) -> None:
        """Stop writing that answer (Esc): what was written is kept, AnswerEnded follows."""
        request.cancel.set()

    def close(self) -> None:
        """The app quits: stop posting, and let every worker waiting on this backend return now."""

    def open_chat(self, chat: Conversation) -> None:
        """`chat` is now the open one: a new chat, or a saved one opened again."""
