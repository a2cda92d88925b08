"""The main screen: conversation, message box and side panel, and the work behind them.

The model loads and answers are generated in thread workers; torch is first
imported there (the hardware probe or engine.load), never when this module
loads. Given a `Pick` instead of files, the model manager (chat/model_manager.py)
chooses a pair for this machine in the worker, the DownloadScreen fetches what
is missing, and then the files load. Answers stream back as batched messages
(chat/bridge.py) and are saved as they grow.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Switch

from dflash_chat.chat.bridge import StreamEnd, stream_answer
from dflash_chat.chat.conversation import CANCELLED, COMPLETE, ERROR, PARTIAL, Conversation, Message, title_from
from dflash_chat.chat.detokenize import IncrementalDecoder
from dflash_chat.chat.history import HistoryStore, HistoryUnavailable
from dflash_chat.chat.memory import memory_use
from dflash_chat.chat.model_source import HOW_TO_PICK, ModelSource, Pick, from_settings, load_device
from dflash_chat.chat.prompt import Prompt, ThinkingSplitter, Transcript, next_prompt, stop_token_ids
from dflash_chat.errors import UserError, one_line
from dflash_chat.settings import Settings
from dflash_chat.ui.keymap import COMMANDS
from dflash_chat.ui.messages import (
    AnswerChunk,
    AnswerEnded,
    DownloadNeeded,
    ModelChosen,
    ModelFailed,
    ModelLoaded,
    ModelReady,
    ModelUnavailable,
    PromptSent,
)
from dflash_chat.ui.notices import PlainNotices
from dflash_chat.ui.widgets.chat_view import AssistantMessage, ChatView
from dflash_chat.ui.widgets.prompt_input import PromptInput
from dflash_chat.ui.widgets.stats_panel import StatsPanel

SAVE_EVERY_S = 1.0  # how often a streaming answer is written to the history
NARROW_WIDTH = 100  # below this many columns the panel moves under the chat, hidden until asked for
CODE_BLOCK = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
END_STATUS = {"stop": COMPLETE, "length": COMPLETE, "cancelled": CANCELLED, "error": ERROR}


def last_code_block(text: str) -> str | None:
    blocks = CODE_BLOCK.findall(text)
    return blocks[-1][1] if blocks else None


@dataclass
class Turn:
    """The answer being written: where its text goes, where it is saved, and the pair writing it."""

    conversation: Conversation
    message: Message
    widget: AssistantMessage
    cancel: threading.Event
    thinking: bool
    pair: Any  # the LoadedPair writing it (the screen's may change meanwhile)
    last_saved: float = 0.0


class ChatScreen(PlainNotices, Screen):
    # priority: a command's key (default or remapped) works wherever the focus is, the message box included
    BINDINGS = [
        Binding(c.keys, c.action, c.title, id=c.id, show=c.footer, priority=True) for c in COMMANDS
    ]

    thinking = reactive(False)

    def __init__(self, settings: Settings, store: HistoryStore, source: ModelSource | Pick | None,
                 prompts: list[str] | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.store = store
        self.request = source  # what the flags or settings asked for: files, or a Pick to choose
        self.source = source if isinstance(source, ModelSource) else None  # the files being loaded
        self.chosen = None  # the model manager's Chosen, when it chose
        self.manager_note = ""  # what the model manager or loader is doing, or why no model runs
        self.conversation = Conversation()
        self.pair = None  # the engine's LoadedPair once loaded
        self.stops: tuple[int, ...] = ()  # its end-of-turn token ids
        self.turn: Turn | None = None
        self.last_prompt: Prompt | None = None
        self.last_end: StreamEnd | None = None
        self.transcript: Transcript | None = None  # what the engine holds, for prefix reuse
        self.transcripts: dict[int, Transcript] = {}  # the last one of each chat, for resuming it
        self._prompts = prompts or []
        self.unsaved: list[Conversation] = []  # chats whose history writes failed (said once each)
        self.set_reactive(ChatScreen.thinking, settings.thinking)

    # layout

    def compose(self):
        yield Header(icon="⚡")
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatView(id="chat")
                yield PromptInput(self._prompts, id="prompt",
                                  placeholder="Message (Enter sends, Shift+Enter or Ctrl+J: new line)")
            yield StatsPanel(id="panel")
        yield Footer()

    async def on_mount(self) -> None:
        self.panel.set_thinking(self.thinking)
        self.query_one(PromptInput).focus()
        await self.chat_view.show(self.conversation, self.notice())
        self.set_interval(2.0, self.refresh_memory, name="memory")
        if self.request is not None:
            self.begin(self.request)

    def on_resize(self) -> None:
        narrow = self.size.width < NARROW_WIDTH
        if narrow != self.has_class("narrow"):
            self.set_class(narrow, "narrow")
            self.panel.set_class(narrow, "hidden")

    @property
    def chat_view(self) -> ChatView:
        return self.query_one(ChatView)

    @property
    def panel(self) -> StatsPanel:
        return self.query_one(StatsPanel)

    @property
    def generating(self) -> bool:
        return self.turn is not None

    def notice(self) -> str:
        """The line shown in an empty chat: what the model manager or loader is doing, or what to do."""
        if self.pair is not None:
            demo = self.source is not None and self.source.demo
            return "This is the tiny built-in demo model: it knows a little Python, nothing more." if demo else ""
        if self.manager_note:
            return self.manager_note
        return f"No model is loaded: {HOW_TO_PICK}. History and settings work without one."

    def model_name(self) -> str:
        """'Qwen3.6-27B Q4_K_M · drafter Q8_0' (a choice), 'tiny demo model', or the files' name."""
        source = self.source
        if source is not None and source.demo:
            return "tiny demo model"
        if source is not None and source.title:
            return f"{source.title} {source.quant_label}".strip()
        if self.pair is not None:
            return self.pair.target_name
        return source.target if source is not None else "no model"

    def loading_note(self, source: ModelSource) -> str:
        if source.demo:
            return "Loading the tiny built-in demo model (it knows a little Python, nothing more)…"
        loading = f"Loading {self.model_name()} …"
        return f"{self.chosen.explanation}\n\n{loading}" if self.chosen else loading

    async def show_notice(self) -> None:
        if not self.conversation.messages:
            await self.chat_view.show(self.conversation, self.notice())

    # model

    def begin(self, request: ModelSource | Pick) -> None:
        """Run what the flags or settings ask for: choose and fetch (a Pick), or load the files given."""
        if isinstance(request, Pick):
            self.start_picking(request)
        else:
            self.request, self.chosen = request, None
            self.start_loading(request)

    def _forget_model(self) -> None:
        self.action_stop()  # the answer being written comes from the model being dropped
        self.pair = None
        self.transcript = None
        self.transcripts.clear()

    def start_picking(self, pick: Pick) -> None:
        """Let the model manager choose for this machine (in the worker: the probe imports torch)."""
        self.request = pick
        self.source = None
        self.chosen = None
        self._forget_model()
        self.manager_note = "Choosing a model for this machine…"
        self.panel.show_model(None, note="choosing…")
        self.sub_title = "choosing a model…"
        self.call_later(self.show_notice)
        self.pick_model(pick, self.settings.context_length)

    @work(thread=True, exclusive=True, group="model")
    def pick_model(self, pick: Pick, context_length: int) -> None:
        post = self.post_message
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

    # A model worker cannot be stopped: messages from one started for an earlier request or
    # source (the settings changed meanwhile) are dropped.

    async def on_model_chosen(self, message: ModelChosen) -> None:
        if message.request is not self.request:
            return
        self.chosen = message.chosen
        self.manager_note = f"{self.chosen.explanation}\n\nChecking the model files…"
        self.panel.show_model(None, note=self.chosen.explanation)
        self.notify(self.chosen.explanation, title="Model choice", timeout=12)
        await self.show_notice()

    async def on_download_needed(self, message: DownloadNeeded) -> None:
        from dflash_chat.chat.model_manager import label
        from dflash_chat.sizes import size_text
        from dflash_chat.ui.download_screen import DownloadScreen

        if message.request is not self.request:
            return
        what = label(message.choice)
        size = size_text(message.plan.missing_bytes())
        self.manager_note = f"{self.chosen.explanation}\n\nDownloading {what} ({size})…"
        self.sub_title = "downloading the model…"
        await self.show_notice()
        self.app.push_screen(DownloadScreen(message.plan, title=f"Downloading {what}"),
                             callback=partial(self.downloaded, message.request, message.choice))

    async def downloaded(self, request: Pick, choice, files) -> None:
        from dflash_chat.chat.model_manager import label, resume_advice, source_for

        if request is not self.request:
            return
        if files is not None:
            self.start_loading(source_for(choice, files))
            return
        advice = resume_advice(choice)  # the screen itself said why it stopped
        self.manager_note = f"{label(choice)} is not downloaded yet. {advice} History and settings work meanwhile."
        self.sub_title = "no model"
        self.panel.show_model(None, note="not downloaded")
        self.notify(advice, title="Model not downloaded", severity="warning", timeout=20)
        await self.show_notice()

    def on_model_ready(self, message: ModelReady) -> None:
        if message.request is self.request:
            self.start_loading(message.source)

    async def on_model_unavailable(self, message: ModelUnavailable) -> None:
        if message.request is not self.request:
            return
        self.manager_note = f"No model yet: {message.error}"
        self.sub_title = "no model"
        self.panel.show_model(None, note="no model")
        self.notify(message.error, title="No model", severity="error", timeout=30)
        await self.show_notice()

    def start_loading(self, source: ModelSource) -> None:
        self.source = source
        self._forget_model()
        note = self.chosen.explanation if self.chosen and not source.demo else "loading…"
        self.panel.show_model(None, note=note)
        self.sub_title = "loading model…"
        self.manager_note = self.loading_note(source)
        self.call_later(self.show_notice)
        self.load_model(source, source.context or self.settings.context_length)

    @work(thread=True, exclusive=True, group="model")
    def load_model(self, source: ModelSource, context_length: int) -> None:
        started = time.perf_counter()
        try:
            from dflash_chat.engine.load import load_pair  # first torch import happens here

            pair = load_pair(source.target, source.drafter, tokenizer=source.tokenizer,
                             device=load_device(source), max_context=context_length, decode=self.settings.decode)
        except Exception as exc:  # noqa: BLE001 - shown to the user, the app carries on
            self.post_message(ModelFailed(source, one_line(exc, "loading the model")))
            return
        self.post_message(ModelLoaded(source, pair, time.perf_counter() - started))

    async def on_model_loaded(self, message: ModelLoaded) -> None:
        if message.source is not self.source:
            return  # loaded for files the settings no longer name; dropping it frees its memory
        self.pair = message.pair
        self.stops = stop_token_ids(message.pair.tokenizer)
        self.manager_note = ""
        name = self.model_name()
        self.sub_title = name
        self.refresh_memory()
        await self.show_notice()
        self.notify(f"{name} is ready ({message.seconds:.1f} s to load)")

    async def on_model_failed(self, message: ModelFailed) -> None:
        if message.source is not self.source:
            return
        self.manager_note = f"The model did not load: {message.error}"
        self.sub_title = "no model"
        self.panel.show_model(None, note="not loaded")
        if not self.conversation.messages:
            await self.chat_view.show(self.conversation, f"The model did not load: {message.error}")
        self.notify(f"The model did not load: {message.error}", severity="error", timeout=15)

    def refresh_memory(self) -> None:
        if self.pair is not None:
            self.panel.show_model(self.pair, memory_use(str(self.pair.device)), source=self.source)

    # sending and generating

    def no_model_yet(self) -> str:
        """Why a message cannot be sent yet: what the model manager or loader is doing, or how to pick."""
        if self.manager_note:
            return self.manager_note.splitlines()[-1]
        return f"No model is loaded yet: {HOW_TO_PICK}."

    def record(self, conversation: Conversation, write, *args):
        """A history write for `conversation`. If it fails, the chat goes on unsaved: said once, in words,
        and no later write of that chat is tried (it would fail the same way, or save half a chat)."""
        if any(c is conversation for c in self.unsaved):
            return None
        try:
            return write(*args)
        except HistoryUnavailable as exc:
            self.unsaved.append(conversation)
            self.notify(f"This chat is not being saved (you can go on chatting): {exc}.", severity="error", timeout=30)
            return None

    @on(PromptInput.Submitted)
    async def send(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if self.generating:
            self.notify("An answer is still being written: Esc stops it.", severity="warning")
            return
        if self.pair is None:
            self.notify(self.no_model_yet(), severity="warning")
            return
        event.input.clear()
        event.input.remember(text)
        if self.conversation.id is None:
            self.conversation.title = title_from(text)
            self.conversation.id = self.record(self.conversation, self.store.create, self.conversation.title)
        message = Message("user", text)
        self.conversation.messages.append(message)
        self.record(self.conversation, self.store.add, self.conversation.id, message)
        await self.chat_view.add_user(text)
        await self.answer()

    async def answer(self) -> None:
        turns = self.conversation.chat_turns(self.settings.system_prompt)
        message = Message("assistant", status=PARTIAL)
        self.conversation.messages.append(message)
        self.record(self.conversation, self.store.add, self.conversation.id, message)
        widget = await self.chat_view.add_assistant()
        self.turn = Turn(self.conversation, message, widget, threading.Event(), self.thinking, self.pair)
        self.generate(self.turn.pair, self.stops, turns, self.thinking, self.settings, self.turn.cancel,
                      self.transcript)

    @work(thread=True, group="generate")
    def generate(self, pair, stops: tuple[int, ...], turns: list[dict], thinking: bool, settings: Settings,
                 cancel: threading.Event, previous: Transcript | None) -> None:
        post = self.post_message
        try:
            from dflash_chat.engine.sampling import SamplingParams

            prompt = next_prompt(pair.tokenizer, turns, thinking=thinking, previous=previous)
            params = SamplingParams(
                temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                max_new_tokens=settings.max_new_tokens, stop_token_ids=stops,
            )
            post(PromptSent(prompt))
            end = stream_answer(
                pair.engine.generate(prompt.ids, params, cancel),
                IncrementalDecoder(pair.tokenizer, stops),
                ThinkingSplitter(thinking=prompt.opens_thinking),
                lambda chunk: post(AnswerChunk(chunk)),
            )
        except Exception as exc:  # noqa: BLE001 - a failed answer must not take the app down
            post(AnswerEnded(StreamEnd("error", "", "", None, one_line(exc, "generation"))))
            return
        held = None
        if end.reason != "error":  # after an error the engine may have dropped its state
            held = Transcript(turns, prompt, list(end.token_ids), end.answer, end.thinking)
        post(AnswerEnded(end, held))

    def on_prompt_sent(self, message: PromptSent) -> None:
        self.last_prompt = message.prompt

    async def on_answer_chunk(self, message: AnswerChunk) -> None:
        turn, chunk = self.turn, message.chunk
        if turn is None:
            return
        turn.message.thinking += chunk.thinking
        turn.message.content += chunk.answer
        if turn.widget.is_attached:
            await turn.widget.append(chunk.thinking, chunk.answer)
        self.panel.show_live(chunk.live, speculative=turn.pair.drafter_name is not None)
        now = time.monotonic()
        if now - turn.last_saved >= SAVE_EVERY_S:
            self.record(turn.conversation, self.store.update, turn.message)
            turn.last_saved = now

    async def on_answer_ended(self, message: AnswerEnded) -> None:
        turn, end = self.turn, message.end
        self.turn = None
        self.last_end = end
        if turn is None:
            return
        # the tokens the engine holds mean nothing to a model loaded since
        held = message.transcript if turn.pair is self.pair else None
        chat_id = turn.conversation.id
        if held is not None and chat_id is not None:
            self.transcripts[chat_id] = held
        else:
            self.transcripts.pop(chat_id, None)
        same_chat = turn.conversation is self.conversation
        self.transcript = held if same_chat else None
        turn.message.thinking, turn.message.content = end.thinking, end.answer
        turn.message.status = END_STATUS.get(end.reason, ERROR)
        turn.message.stats = end.stats
        self.record(turn.conversation, self.store.update, turn.message)
        if turn.widget.is_attached:
            await turn.widget.finish(turn.message, end.error)
        if end.stats is not None:
            self.panel.show_final(end.stats, thinking=turn.thinking)
        if end.error:
            self.notify(end.error, severity="error", timeout=15)

    # actions (each also in the command palette, see app.py)

    def action_toggle_thinking(self) -> None:
        self.thinking = not self.thinking

    def watch_thinking(self, on: bool) -> None:
        if self.is_mounted:
            self.panel.set_thinking(on)
            self.notify(f"Thinking {'on' if on else 'off'} from the next answer")

    @on(Switch.Changed, "#thinking-switch")
    def thinking_switched(self, event: Switch.Changed) -> None:
        self.thinking = event.value

    def action_stop(self) -> None:
        if self.turn is not None:
            self.turn.cancel.set()

    async def action_new_chat(self) -> None:
        self.action_stop()
        self.transcript = None
        self.conversation = Conversation()
        self.panel.show_figures(None)
        await self.chat_view.show(self.conversation, self.notice())
        self.query_one(PromptInput).focus()

    async def open_conversation(self, conversation_id: int) -> None:
        try:
            conversation = self.store.load(conversation_id)
        except UserError as exc:  # gone, or the history cannot be read just now
            self.notify(f"Could not open that chat: {exc}", severity="error", timeout=20)
            return
        self.action_stop()
        self.transcript = self.transcripts.get(conversation_id)
        self.conversation = conversation
        await self.chat_view.show(self.conversation)
        last = self.conversation.last("assistant")
        self.panel.show_figures(None)
        if last is not None and last.stats is not None:
            self.panel.show_final(last.stats)
        self.query_one(PromptInput).focus()

    async def conversation_deleted(self) -> None:
        """After the history screen: start afresh if the open chat was deleted there."""
        if self.conversation.id is None:
            return
        try:
            saved = {s.id for s in self.store.summaries()}
        except UserError:
            return  # the history cannot be read just now: keep the chat open
        if self.conversation.id not in saved:
            await self.action_new_chat()

    async def action_regenerate(self) -> None:
        if self.generating:
            self.notify("An answer is still being written: Esc stops it.", severity="warning")
            return
        if self.pair is None:
            self.notify(self.no_model_yet(), severity="warning")
            return
        messages = self.conversation.messages
        if not messages:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        if messages[-1].role == "assistant":
            old = messages.pop()
            if old.id is not None:
                self.record(self.conversation, self.store.remove_message, old.id)
            widgets = self.chat_view.query(AssistantMessage)
            if widgets:
                await widgets.last().remove()
        await self.answer()

    def _last_answer(self) -> str | None:
        message = self.conversation.last("assistant")
        return message.content if message and message.content else None

    def action_copy_answer(self) -> None:
        text = self._last_answer()
        if text is None:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(text)
        self.notify("Copied the last answer")

    def action_copy_code(self) -> None:
        code = last_code_block(self._last_answer() or "")
        if code is None:
            self.notify("The last answer has no code block.", severity="warning")
            return
        self.app.copy_to_clipboard(code)
        self.notify("Copied the last code block")

    def action_focus_switch(self) -> None:
        prompt = self.query_one(PromptInput)
        (self.chat_view if prompt.has_focus else prompt).focus()

    def action_toggle_panel(self) -> None:
        self.panel.toggle_class("hidden")

    def action_history(self) -> None:
        self.app.action_open_history()

    def action_settings(self) -> None:
        self.app.action_open_settings()

    def apply_settings(self, new: Settings) -> None:
        old, self.settings = self.settings, new
        if new.thinking != old.thinking:
            self.thinking = new.thinking
        if (new.model, new.drafter) != (old.model, old.drafter):
            try:
                request = from_settings(new)
            except UserError as exc:
                self.notify(f"model: {exc}", severity="error", timeout=20)
                return
            self.begin(request)
        elif new.context_length != old.context_length:
            # a copy, not the same object: what a worker still posts for the old context is then stale
            if isinstance(self.request, Pick) and self.request.context is None:
                self.begin(replace(self.request))  # a new context may change what fits
            elif self.source is not None and self.source.context is None:
                self.start_loading(replace(self.source))
