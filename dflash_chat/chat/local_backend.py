"""The engine in this process as a backend: choose a pair, fetch it, load it, answer, reuse prefixes.

Given a `Pick` the model manager (chat/model_manager.py) chooses a pair for this machine in a worker
(the probe imports torch), reports a DownloadNeeded when files are missing (the screen fetches them,
then calls `downloaded`), and the files load in another worker with LoadProgress events. Given files
(a ModelSource) they load at once. Answers run through chat/session.py, one transcript kept per chat
so a chat's next prompt starts with the tokens the engine holds. `serve` drives this same class with
a `post` of its own (commands/serve.py). torch is imported only inside the workers.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

from dflash_chat.chat.backend import (
    AnswerChunk,
    AnswerEnded,
    AnswerRequest,
    Backend,
    DownloadNeeded,
    LoadProgress,
    ModelChosen,
    ModelFailed,
    ModelLoaded,
    ModelReady,
    ModelUnavailable,
    PromptSent,
)
from dflash_chat.chat.bridge import StreamEnd
from dflash_chat.chat.memory import memory_use
from dflash_chat.chat.model_source import HOW_TO_PICK, ModelSource, Pick, load_device
from dflash_chat.chat.prompt import Transcript
from dflash_chat.errors import one_line
from dflash_chat.settings import Settings

PROGRESS_EVERY_S = 0.1  # loading progress is posted at most this often


class LocalBackend(Backend):
    def __init__(self, settings: Settings, request: ModelSource | Pick | None = None) -> None:
        self.settings = settings  # the screen keeps it current (context_length, decode, draft)
        self.request = request  # what the flags or settings asked for: files, or a Pick to choose
        self.source = request if isinstance(request, ModelSource) else None  # the files being loaded
        self.chosen = None  # the model manager's Chosen, when it chose
        self.session = None  # chat.session.EngineSession once loaded
        self.transcript: Transcript | None = None  # what the engine holds of the open chat
        self.transcripts: dict[int, Transcript] = {}  # the last one of each chat, for resuming it
        self.subtitle = ""
        self.panel_note = ""
        self._note = ""
        self._opened = itertools.count(1)
        self._chat_key = 0  # which opening of a chat the answers belong to (see `answer`)

    # what the screen reads

    @property
    def pair(self):
        return self.session.pair if self.session is not None else None

    @property
    def model(self):
        return self.pair

    @property
    def speculative(self) -> bool:
        return self.session is not None and self.session.speculative

    @property
    def note(self) -> str:
        if self.session is not None:
            demo = self.source is not None and self.source.demo
            return "This is the tiny built-in demo model: it knows a little Python, nothing more." if demo else ""
        return self._note or f"No model is loaded: {HOW_TO_PICK}. History and settings work without one."

    def no_model_yet(self) -> str:
        if self._note:
            return self._note.splitlines()[-1]
        return f"No model is loaded yet: {HOW_TO_PICK}."

    def name(self) -> str:
        """'Qwen3.6-27B Q4_K_M · drafter Q8_0' (a choice), 'tiny demo model', or the files' name."""
        source = self.source
        if source is not None and source.demo:
            return "tiny demo model"
        if source is not None and source.title:
            return f"{source.title} {source.quant_label}".strip()
        if self.pair is not None:
            return self.pair.target_name
        return source.target if source is not None else "no model"

    def rows(self) -> tuple[tuple[str, str], ...]:
        from dflash_chat.sizes import size_text

        pair, source = self.pair, self.source
        if pair is None:
            return ()
        title = getattr(source, "title", "")
        drafter = pair.drafter_name.rsplit("/", 1)[-1] if pair.drafter_name else "none (plain decoding)"
        rows = [("target", title or pair.target_name), ("drafter", drafter)]
        if quant := getattr(source, "quant_label", ""):
            rows.append(("quant", quant))
        rows.append(("device", f"{pair.device} · {str(pair.dtype).removeprefix('torch.')}"))
        memory = memory_use(str(pair.device))
        if memory is not None:
            rows.append((memory.kind, f"{size_text(memory.used_bytes)} / {size_text(memory.total_bytes)}"))
        return tuple(rows)

    def _status(self, note: str, subtitle: str, panel: str) -> None:
        self._note, self.subtitle, self.panel_note = note, subtitle, panel

    # lifecycle (UI thread)

    def begin(self, request: ModelSource | Pick) -> None:
        """Run what the flags or settings ask for: choose and fetch (a Pick), or load the files given."""
        if isinstance(request, Pick):
            self.request, self.source, self.chosen = request, None, None
            self._forget_model()
            self._status("Choosing a model for this machine…", "choosing a model…", "choosing…")
            self.spawn(lambda: self._pick(request, self.settings.context_length), "model")
        else:
            self.request, self.chosen = request, None
            self.start_loading(request)

    def start_loading(self, source: ModelSource) -> None:
        self.source = source
        self._forget_model()
        if source.demo:
            note = "Loading the tiny built-in demo model (it knows a little Python, nothing more)…"
        else:
            loading = f"Loading {self.name()} …"
            note = f"{self.chosen.explanation}\n\n{loading}" if self.chosen else loading
        panel = self.chosen.explanation if self.chosen and not source.demo else "loading…"
        self._status(note, "loading model…", panel)
        settings = self.settings
        context, decode, draft = source.context or settings.context_length, settings.decode, settings.draft
        self.spawn(lambda: self._load(source, context, decode, draft), "model")

    def reload_for_context(self) -> None:
        """The context length changed: a choice may change, loaded files load again (as a new request:
        what workers still post for the old one is then stale)."""
        if isinstance(self.request, Pick) and self.request.context is None:
            self.begin(replace(self.request))
        elif self.source is not None and self.source.context is None:
            self.start_loading(replace(self.source))

    def downloaded(self, request: Pick, choice, files) -> str | None:
        """After the download screen: load what it fetched; the advice to show when it did not."""
        from dflash_chat.chat.model_manager import label, resume_advice, source_for

        if request is not self.request:
            return None
        if files is not None:
            self.start_loading(source_for(choice, files))
            return None
        advice = resume_advice(choice)  # the screen itself said why it stopped
        self._status(
            f"{label(choice)} is not downloaded yet. {advice} History and settings work meanwhile.",
            "no model",
            "not downloaded",
        )
        return advice

    def _forget_model(self) -> None:
        self.session = None
        self.transcript = None
        self.transcripts.clear()

    def handle(self, event: object) -> bool:
        if isinstance(event, (ModelChosen, DownloadNeeded, ModelReady, ModelUnavailable)):
            if event.request is not self.request:
                return False
            return self._on_choice(event)
        if isinstance(event, (LoadProgress, ModelLoaded, ModelFailed)):
            if event.source is not self.source:
                return False  # loaded for files the settings no longer name; dropping it frees its memory
            return self._on_load(event)
        if isinstance(event, AnswerEnded):
            self._on_answer_ended(event)
        return True

    def _on_choice(self, event) -> bool:
        from dflash_chat.chat.model_manager import label
        from dflash_chat.sizes import size_text

        if isinstance(event, ModelChosen):
            self.chosen = event.chosen
            self._status(
                f"{self.chosen.explanation}\n\nChecking the model files…", self.subtitle, self.chosen.explanation
            )
        elif isinstance(event, DownloadNeeded):
            what, size = label(event.choice), size_text(event.plan.missing_bytes())
            self._status(
                f"{self.chosen.explanation}\n\nDownloading {what} ({size})…", "downloading the model…", self.panel_note
            )
        elif isinstance(event, ModelReady):
            self.start_loading(event.source)
        else:
            self._status(f"No model yet: {event.error}", "no model", "no model")
        return True

    def _on_load(self, event) -> bool:
        if isinstance(event, ModelLoaded):
            from dflash_chat.chat.session import EngineSession

            self.session = EngineSession(event.model)
            self._status("", self.name(), "")
        elif isinstance(event, ModelFailed):
            self._status(f"The model did not load: {event.error}", "no model", "not loaded")
        return True

    def _on_answer_ended(self, event: AnswerEnded) -> None:
        # the tokens the engine holds mean nothing to a model loaded since
        held = event.transcript if event.model is not None and event.model is self.pair else None
        chat_id = getattr(event.chat, "id", None)
        if held is not None and chat_id is not None:
            self.transcripts[chat_id] = held
        else:
            self.transcripts.pop(chat_id, None)
        self.transcript = held if event.chat is self._open_chat else None

    _open_chat = None

    def open_chat(self, chat) -> None:
        self._open_chat = chat
        self._chat_key = next(self._opened)
        chat_id = getattr(chat, "id", None)
        self.transcript = self.transcripts.get(chat_id) if chat_id is not None else None

    # worker bodies (no UI; they only post)

    def _pick(self, pick: Pick, context_length: int) -> None:
        post = self.post
        try:
            from dflash_chat import hub
            from dflash_chat.chat import model_manager

            chosen = model_manager.choose(pick, context_length)
            post(ModelChosen(pick, chosen))
            if chosen.demo is not None:
                post(ModelReady(pick, chosen.demo))
                return
            plan = model_manager.plan_files(chosen.choice)
            if plan.to_fetch:
                post(DownloadNeeded(pick, chosen.choice, plan))
                return
            files = hub.download(plan)  # everything is cached: this only links the snapshot files
            post(ModelReady(pick, model_manager.source_for(chosen.choice, files)))
        except Exception as exc:  # noqa: BLE001 - shown to the user, the app carries on
            post(ModelUnavailable(pick, one_line(exc, "choosing a model")))

    def _load(self, source: ModelSource, context_length: int, decode: str, draft: str | int) -> None:
        post = self.post
        started = time.perf_counter()
        last = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - last[0] >= PROGRESS_EVERY_S or done >= total:
                last[0] = now
                post(LoadProgress(source, done, total, now - started))

        try:
            from dflash_chat.engine.load import load_pair  # first torch import happens here

            pair = load_pair(
                source.target,
                source.drafter,
                tokenizer=source.tokenizer,
                device=load_device(source),
                max_context=context_length,
                decode=decode,
                draft=draft,
                progress=progress,
            )
        except Exception as exc:  # noqa: BLE001 - shown to the user, the app carries on
            post(ModelFailed(source, one_line(exc, "loading the model")))
            return
        post(ModelLoaded(source, pair, time.perf_counter() - started))

    def answer(self, request: AnswerRequest) -> None:
        session, previous = self.session, self.transcript
        # auto's acceptance estimate: one per opening of a chat (a new chat, or another one opened, starts
        # afresh from the engine's estimate over all answers) and per thinking setting within it, since
        # drafters accept far less of thinking text
        conversation = ("chat", self._chat_key, request.thinking)
        self.spawn(lambda: self._answer(session, request, previous, conversation), "generate")

    def _answer(self, session, request: AnswerRequest, previous: Transcript | None, conversation) -> None:
        post = self.post
        try:
            session.use_draft(request.draft)  # here, not on the UI thread: it rebuilds the engine's steps
            prompt = session.chat_prompt(request.turns, request.thinking, previous)
            params = session.params(
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k,
                max_new_tokens=request.max_new_tokens,
            )
            post(PromptSent(prompt))
            end = session.answer(
                prompt, params, request.cancel, lambda chunk: post(AnswerChunk(chunk)), conversation=conversation
            )
        except Exception as exc:  # noqa: BLE001 - a failed answer must not take the app down
            post(
                AnswerEnded(
                    StreamEnd("error", "", "", None, one_line(exc, "generation")), None, session.pair, request.chat
                )
            )
            return
        post(AnswerEnded(end, session.held(request.turns, prompt, end), session.pair, request.chat))
