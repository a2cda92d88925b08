"""The engine in this process as a backend: the model loader (runtime/loader.py) and, once a pair is
loaded, the answering service (runtime/answering.py) that keeps what the engine holds of each chat.

Answers run in "generate" workers through runtime/session.py; the open chat's next prompt starts with the
tokens the engine holds of it, and a saved chat opened again does too. torch is imported only inside
the workers.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import TYPE_CHECKING

from dflash_chat.chat.backends.base import AnswerRequest, Backend
from dflash_chat.chat.events import AnswerEnded, PromptSent
from dflash_chat.chat.images import engine_turns
from dflash_chat.errors import one_line
from dflash_chat.runtime.answering import AnsweringService
from dflash_chat.runtime.bridge import StreamEnd
from dflash_chat.runtime.events import LoadEvent, Status
from dflash_chat.runtime.loader import LoadOptions, ModelLoader
from dflash_chat.runtime.memory import memory_use
from dflash_chat.runtime.model_source import ModelSource, Pick, from_settings

if TYPE_CHECKING:
    from dflash_chat.chat.conversation import Conversation
    from dflash_chat.engine.draft_length import DraftMemory
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.models.hardware import Choice
    from dflash_chat.models.hub import ModelFiles
    from dflash_chat.runtime.prompt import Transcript
    from dflash_chat.settings import Settings

OPEN = "open chat"  # the service's key for the open chat (saved chats are kept by their id too)


class LocalBackend(Backend):
    def __init__(self, settings: Settings, request: ModelSource | Pick | None = None) -> None:
        self.settings = settings  # kept current by apply_settings
        self.request: ModelSource | Pick | None = (
            request  # what the flags or settings asked for: files, or a Pick to choose
        )
        self.loader = ModelLoader(
            lambda event: self.post(event), lambda body, group: self.spawn(body, group), LoadOptions.of(settings)
        )
        self._service: AnsweringService | None = None
        self._open_chat: Conversation | None = None
        self._opened = itertools.count(1)
        self._opening = 0  # which opening of a chat the answers belong to (see `answer`)

    # what the screen reads

    @property
    def pair(self) -> LoadedPair | None:
        return self.loader.pair

    @property
    def source(self) -> ModelSource | None:
        return self.loader.source

    @property
    def service(self) -> AnsweringService | None:
        """The loaded pair's answering service (a new one for each pair loaded)."""
        pair = self.loader.pair
        if pair is None:
            self._service = None
        elif self._service is None or self._service.pair is not pair:
            self._service = AnsweringService.of(pair)
        return self._service

    @property
    def model(self) -> LoadedPair | None:
        return self.pair

    @property
    def speculative(self) -> bool:
        service = self.service
        return service is not None and service.session.speculative

    @property
    def status(self) -> Status:
        return self.loader.status

    @property
    def transcript(self) -> Transcript | None:
        """What the engine holds of the open chat."""
        service = self.service
        return service.held(OPEN) if service is not None else None

    @property
    def transcripts(self) -> dict[Hashable, Transcript]:
        """What the engine holds of each saved chat, by its id."""
        service = self.service
        return {k: v for k, v in service.chats.items() if k != OPEN} if service is not None else {}

    def name(self) -> str:
        return self.loader.name()

    def rows(self) -> tuple[tuple[str, str], ...]:
        from dflash_chat.models.sizes import size_text

        pair, source = self.pair, self.source
        if pair is None:
            return ()
        rows = [("target", self.loader.name() if source is None or source.demo else source.title or pair.target_name)]
        rows.append(("drafter", drafter_name(pair, demo=source is not None and source.demo)))
        if source is not None and source.target_quant:  # a row each: both on one are wider than the panel at 80
            rows.append(("quant", source.target_quant))
        if source is not None and source.drafter and source.drafter_quant:
            rows.append(("drafter quant", source.drafter_quant))
        rows.append(("device", f"{pair.device} · {str(pair.dtype).removeprefix('torch.')}"))
        if vision := self._vision_row():
            rows.append(("vision", vision))
        memory = memory_use(str(pair.device))
        if memory is not None:
            rows.append((memory.kind, f"{size_text(memory.used_bytes)} / {size_text(memory.total_bytes)}"))
        return tuple(rows)

    def _vision_row(self) -> str:
        """'loaded', 'off' (the setting) or 'no room' (the pick left it out: `dflash-chat models` says why) for a
        model with a vision tower; '' for one without."""
        if self.pair is not None and self.pair.vision is not None:
            return "loaded"
        chosen = self.loader.chosen.choice if self.loader.chosen is not None else None
        if chosen is None or chosen.pair.vision is None:
            return ""
        return "off" if self.loader.options.vision == "off" else "no room"

    def images_refused(self) -> str:
        pair = self.pair
        if pair is None or pair.vision is not None:
            return ""
        if self.settings.vision == "off":
            how = "the vision setting is off: set vision to auto in Settings (Ctrl+S)"
        elif self._vision_row() == "no room":
            how = "its vision tower was left out, as it does not fit beside the model here (`dflash-chat models` says why)"
        else:
            how = "it has no vision tower: choose a vision model, or give a GGUF its tower with --mmproj FILE"
        return f"This model reads no images: {how}."

    # lifecycle (UI thread)

    def begin(self) -> None:
        if self.request is not None:
            self.loader.begin(self.request)

    def apply_settings(self, settings: Settings) -> bool:
        old, self.settings = self.settings, settings
        self.loader.options = LoadOptions.of(settings)
        if (settings.model, settings.drafter) != (old.model, old.drafter):
            self.request = from_settings(settings)
            self.begin()
            return True
        if settings.context_length != old.context_length:
            self.loader.reload_for_context()  # a new context may change what fits, or needs a reload
            return True
        if settings.vision != old.vision:
            self.loader.reload()  # the vision tower loads or goes with the pick
            return True
        return False

    def handle(self, event: LoadEvent) -> bool:
        return self.loader.handle(event)

    def downloaded(self, request: Pick, choice: Choice, files: ModelFiles | None) -> None:
        self.loader.downloaded(request, choice, files)

    def open_chat(self, chat: Conversation) -> None:
        self._open_chat = chat
        self._opening = next(self._opened)
        service = self.service
        if service is not None:
            service.keep(OPEN, service.held(chat.id) if chat.id is not None else None)

    def answer_ended(self, event: AnswerEnded) -> None:
        service = self.service
        if service is None:
            return
        # the tokens the engine holds mean nothing to a model loaded since
        held = event.transcript if event.model is not None and event.model is service.pair else None
        chat = event.chat
        if chat is not None and chat.id is not None:
            service.keep(chat.id, held)
        service.keep(OPEN, held if chat is self._open_chat else None)

    def answer(self, request: AnswerRequest) -> None:
        service = self.service
        assert service is not None, "answer() before a model is ready"
        previous = service.held(OPEN)
        # what auto has learned: one memory per opening of a chat (a new chat, or another one opened, starts
        # from the drafter's records over all answers) and per thinking setting within it, since drafters
        # accept far less of thinking text
        memory = service.memory(("chat", self._opening, request.thinking))
        self.spawn(lambda: self._answer(service, request, previous, memory), "generate")

    # a worker body (no UI; it only posts)

    def _answer(
        self, service: AnsweringService, request: AnswerRequest, previous: Transcript | None, memory: DraftMemory
    ) -> None:
        post, session = self.post, service.session
        try:
            # here, not on the UI thread: it rebuilds the engine's steps
            session.use_draft(request.draft, request.speculate)
            turns = engine_turns(request.turns, request.images) if request.images is not None else request.turns
            prompt = session.chat_prompt(turns, request.thinking, previous, request.tools)
            post(PromptSent(prompt))
            end = session.answer(prompt, request.sampling, request.cancel, post, memory=memory, tools=request.tools)
        except Exception as exc:  # noqa: BLE001 - a failed answer must not take the app down
            error = StreamEnd("error", "", "", None, one_line(exc, "generation"))
            post(AnswerEnded(error, None, session.pair, request.chat))
            return
        post(AnswerEnded(end, session.held(turns, prompt, end), session.pair, request.chat))


def drafter_name(pair, *, demo: bool) -> str:
    """The drafter as the panel names it: the demo's by what it is ("DFlash2 (demo)", not its folder drafter2),
    another by its file's or repo's name."""
    if not pair.drafter_name:
        return "none"  # the MTP layer and prompt lookup may still draft
    if demo:
        kind = "DFlash2" if type(pair.engine.drafter).__name__ == "DFlash2Drafter" else "DFlash"
        return f"{kind} (demo)"
    return pair.drafter_name.rsplit("/", 1)[-1]
