"""The main screen: conversation, message box and side panel; it renders and routes keys.
One file past 500 lines: its handlers all act on one screen's state (the chat, its answer, its agent loop).

What answers sits behind the backend the app gives it (chat/backends/): the engine in this process
(choose, download, load, answer, reuse prefixes) or an OpenAI-compatible server. The backend's worker
bodies run here as thread workers and post events; each arrives as a message of its own kind
(ui/messages.py), goes to the backend first (is it still current?), then is shown, worded by
ui/status_text.py. torch is imported only inside those workers, never when this module loads. Chats
are saved as they grow (chat/recorder.py).

A message to a chat that offers tools runs as an agent loop (chat/agent.py): the screen starts the tool
servers the chat needs (chat/tools/servers.py), shows each call the model makes as a block, asks before
it runs (ui/confirm_call_screen.py), and answers again once the calls have their results. Esc stops all
of it; what was written is kept.

Images go with the next message (chat/attach.py): a `/image PATH` line, the attach key's path dialog, or a pasted
path. Each is read and stored in a worker, then waits as a chip above the message box (ui/widgets/image_chips.py)
until the message is sent; a model that reads no images says so, and nothing is sent.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from textual import on
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Switch

from dflash_chat import paths
from dflash_chat.chat import attach
from dflash_chat.chat.agent import AgentLoop, PendingCall
from dflash_chat.chat.backends.base import AnswerRequest, Backend, BackendEvent
from dflash_chat.chat.conversation import CANCELLED, COMPLETE, CUT, ERROR, PARTIAL, Conversation, Message
from dflash_chat.chat.history import HistoryStore
from dflash_chat.chat.images import Attachment, ImageStore, Preview
from dflash_chat.chat.recorder import Recorder
from dflash_chat.chat.tools import results
from dflash_chat.chat.tools.results import ToolResult
from dflash_chat.chat.tools.servers import READY, ToolServers
from dflash_chat.errors import UserError
from dflash_chat.runtime.bridge import StreamEnd
from dflash_chat.runtime.endpoint import ServedModel
from dflash_chat.runtime.model_source import Pick
from dflash_chat.runtime.prompt import Prompt
from dflash_chat.runtime.tool_calls import ToolCall
from dflash_chat.settings import Settings
from dflash_chat.ui import messages, status_text, terminal_graphics
from dflash_chat.ui.confirm_call_screen import ALWAYS, NO, STOP, YES, ConfirmCallScreen
from dflash_chat.ui.dialogs import TextDialog
from dflash_chat.ui.keymap import COMMANDS
from dflash_chat.ui.notices import PlainNotices
from dflash_chat.ui.widgets import image_preview
from dflash_chat.ui.widgets.chat_view import AssistantMessage, ChatView
from dflash_chat.ui.widgets.image_chips import ImageChip, PendingImages
from dflash_chat.ui.widgets.load_bar import LoadBar
from dflash_chat.ui.widgets.prompt_input import PromptInput
from dflash_chat.ui.widgets.stats_panel import StatsPanel
from dflash_chat.ui.widgets.tool_call_block import RUNNING, WAITING, ToolCallBlock

if TYPE_CHECKING:
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.models.hardware import Choice
    from dflash_chat.models.hub import ModelFiles

SAVE_EVERY_S = 1.0  # how often a streaming answer is written to the history
ON_THE_WAY = ("choosing", "checking", "downloading", "loading", "connecting")  # a model will be ready: a message waits
NARROW_WIDTH = 100  # below this many columns the panel moves under the chat, hidden until asked for
CODE_BLOCK = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
END_STATUS = {"stop": COMPLETE, "length": COMPLETE, "cancelled": CANCELLED, "error": ERROR, "cut": CUT}


def last_code_block(text: str) -> str | None:
    blocks = CODE_BLOCK.findall(text)
    return blocks[-1][1] if blocks else None


@dataclass
class Turn:
    """The answer being written: where its text goes, where it is saved, and the model writing it."""

    conversation: Conversation
    message: Message
    widget: AssistantMessage
    request: AnswerRequest
    model: LoadedPair | ServedModel | None  # what writes it (the backend's may change meanwhile)
    last_saved: float = 0.0

    @property
    def thinking(self) -> bool:
        return self.request.thinking


class ChatScreen(PlainNotices, Screen):
    # priority: a command's key (default or remapped) works wherever the focus is, the message box included
    BINDINGS = [Binding(c.keys, c.action, c.title, id=c.id, show=c.footer, priority=True) for c in COMMANDS]

    thinking = reactive(False)

    def __init__(
        self,
        settings: Settings,
        store: HistoryStore,
        backend: Backend,
        prompts: list[str] | None = None,
        servers: ToolServers | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.store = store
        self.backend = backend
        self.backend.attach(self._post, self._spawn)
        self.servers = servers or ToolServers(settings.mcp, paths.data_dir())
        self.servers.attach(self._post)
        self.recorder = Recorder(store, self._warn_unsaved)
        self.conversation = Conversation()
        self.backend.open_chat(self.conversation)
        self.turn: Turn | None = None
        self.loop: AgentLoop | None = None  # the message's agent loop, while it runs
        self.asking: ConfirmCallScreen | None = None  # the question about a call, while it is open
        self.waiting: Conversation | None = None  # a chat whose last message waits for the model to be ready
        self.last_prompt: Prompt | None = None
        self.last_end: StreamEnd | None = None
        self.images = ImageStore(store.images_folder)  # the chats' images, by content hash
        self.pending: list[tuple[Attachment, Preview | None]] = []  # the images the next message will hold
        self.attaching = 0  # images being read for it
        self._prompts = prompts or []
        self.set_reactive(ChatScreen.thinking, settings.thinking)

    # the backend's threads and messages

    def _post(self, event: BackendEvent | attach.AttachEvent) -> None:
        self.post_message(messages.message_for(event))  # from a worker thread: never blocks it

    def _spawn(self, body: Callable[[], None], group: str) -> None:
        # a new model job replaces the one before (its late messages are stale); answers run side by side
        self.run_worker(body, thread=True, group=group, exclusive=group == "model")

    def _warn_unsaved(self, text: str) -> None:
        self.notify(text, severity="error", timeout=30)

    # layout

    def compose(self):
        yield Header(icon="⚡")
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatView(id="chat")
                yield LoadBar(id="load-bar")
                yield PendingImages(id="pending-images")
                yield PromptInput(
                    self._prompts, id="prompt", placeholder="Message (Enter sends, Shift+Enter or Ctrl+J: new line)"
                )
            yield StatsPanel(id="panel")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one(PendingImages).display = False
        self.panel.set_thinking(self.thinking)
        self.query_one(PromptInput).focus()
        await self.chat_view.show(self.conversation, self.notice())
        self.set_interval(2.0, self.refresh_model, name="memory")
        if self.backend.request is not None:
            self.begin()

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
        return self.turn is not None or self.loop is not None

    def notice(self) -> str:
        """The line shown in an empty chat: what the backend is doing, or what to do."""
        return status_text.note(self.backend.status)

    async def show_notice(self) -> None:
        if not self.conversation.messages:
            await self.chat_view.show(self.conversation, self.notice())

    def show_status(self) -> None:
        """The backend's state in the title bar and the panel's Model section."""
        backend, status = self.backend, self.backend.status
        self.sub_title = status_text.subtitle(status, backend.name())
        self.panel.show_model(backend.rows(), note=status_text.panel_note(status, remote=backend.remote))

    def refresh_model(self) -> None:
        if self.backend.model is not None:
            self.panel.show_model(self.backend.rows())

    # model

    def begin(self) -> None:
        """Start on what the flags or settings ask for."""
        self.action_stop()  # the answer being written comes from the model being dropped
        self.backend.begin()
        self._model_changed()

    def _model_changed(self) -> None:
        self.query_one(LoadBar).hide()
        self.show_status()
        self.call_later(self.show_notice)

    async def on_model_chosen(self, message: messages.ModelChosen) -> None:
        if not self.backend.handle(message.event):
            return  # from a worker started for an earlier request or model
        self.show_status()
        self.notify(message.event.chosen.explanation, title="Model choice", timeout=12)
        await self.show_notice()

    async def on_download_needed(self, message: messages.DownloadNeeded) -> None:
        from dflash_chat.runtime.model_manager import label
        from dflash_chat.ui.download_screen import DownloadScreen

        event = message.event
        if not self.backend.handle(event):
            return
        self.show_status()
        await self.show_notice()
        self.app.push_screen(
            DownloadScreen(event.plan, title=f"Downloading {label(event.choice)}"),
            callback=partial(self.downloaded, event.request, event.choice),
        )

    async def downloaded(self, request: Pick, choice: Choice, files: ModelFiles | None) -> None:
        self.backend.downloaded(request, choice, files)
        self.show_status()
        status = self.backend.status
        if files is None and status.stage == "not_downloaded":  # the download screen said why it stopped
            self.notify(status.advice, title="Model not downloaded", severity="warning", timeout=20)
        await self.show_notice()

    async def on_model_ready(self, message: messages.ModelReady) -> None:
        if not self.backend.handle(message.event):
            return
        self.show_status()
        await self.show_notice()

    async def on_model_unavailable(self, message: messages.ModelUnavailable) -> None:
        if not self.backend.handle(message.event):
            return
        self.waiting = None
        self.show_status()
        self.notify(message.event.error, title="No model", severity="error", timeout=30)
        await self.show_notice()

    async def on_load_progress(self, message: messages.LoadProgress) -> None:
        event = message.event
        if self.backend.handle(event):
            self.query_one(LoadBar).show(self.backend.name(), event.done, event.total, event.seconds)

    async def on_model_loaded(self, message: messages.ModelLoaded) -> None:
        if not self.backend.handle(message.event):
            return
        self.query_one(LoadBar).hide()
        self.show_status()
        await self.show_notice()
        self.notify(status_text.ready_text(self.backend, message.event.seconds))
        waiting, self.waiting = self.waiting, None
        if waiting is self.conversation and waiting.messages and waiting.messages[-1].role == "user":
            refused = self.backend.images_refused() if waiting.messages[-1].images else ""
            if refused:  # its images would not be seen: the message stays
                self.notify(
                    f"Your message was not answered: {refused} Ctrl+R answers it without its images.",
                    severity="warning",
                    timeout=20,
                )
            else:
                await self.start_loop()  # the message sent while the model loaded
        for note in getattr(message.event.model, "notes", ()):  # what was fitted to the pair (engine/load.py)
            self.notify(note, severity="warning", timeout=15)

    async def on_model_failed(self, message: messages.ModelFailed) -> None:
        if not self.backend.handle(message.event):
            return
        self.waiting = None  # the message stays in the chat: Ctrl+R answers it once a model runs
        error = message.event.error
        self.query_one(LoadBar).hide()
        self.show_status()
        if not self.conversation.messages:
            await self.chat_view.show(self.conversation, f"The model did not load: {error}")
        self.notify(f"The model did not load: {error}", severity="error", timeout=15)

    # sending and generating

    def _can_answer(self, *, or_wait: bool = False) -> bool:
        """Whether a new answer can start now (`or_wait`: or once the model on its way is ready); if not, the user
        is told why."""
        if self.generating:
            self.notify("An answer is still being written: Esc stops it.", severity="warning")
            return False
        if self.waiting is not None and self.waiting is self.conversation:
            self.notify("Your last message waits for the model; this one stays in the box.", severity="warning")
            return False
        if self.backend.model is None and not (or_wait and self.backend.status.stage in ON_THE_WAY):
            self.notify(f"Not sent: {status_text.no_model_yet(self.backend.status)}", severity="warning")
            return False
        return True

    @on(PromptInput.Submitted)
    async def send(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if attach.is_command(text):
            self.attach_typed(event.input, text)
            return
        if not text and not self.pending:
            return
        if self.attaching:
            self.notify("An image is still being read: send again in a moment.", severity="warning")
            return
        images = tuple(image for image, _ in self.pending)
        refused = self.backend.images_refused() if images else ""
        if refused:
            self.notify(
                f"Not sent: {refused} Remove the images (Delete on a chip) to send the text.",
                severity="warning",
                timeout=20,
            )
            return
        if not self._can_answer(or_wait=True):
            return
        event.input.clear()
        event.input.remember(text)
        if self.conversation.id is None:
            self.recorder.start(self.conversation, text or ", ".join(image.name for image in images))
        message = Message("user", text, images=images)
        self.conversation.messages.append(message)
        self.recorder.add(self.conversation, message)
        self.pending = []
        await self.show_pending()
        await self.chat_view.add_user(message)
        if self.backend.model is None:  # shown and saved now, answered once the model is ready
            self.waiting = self.conversation
            self.notify(f"Sent once the model is ready. {status_text.no_model_yet(self.backend.status)}")
            return
        await self.start_loop()

    # images for the next message (chat/attach.py)

    def attach(self, paths: list[str], *, typed: bool = False) -> bool:
        """Read and store the images at `paths` in a worker (each arrives as ImageAttached or ImageRefused); False
        when the model reads no images (said in a notice)."""
        refused = self.backend.images_refused()
        if refused:
            self.notify(refused, severity="warning", timeout=20)
            return False
        self.attaching += len(paths)
        self.run_worker(partial(attach.read_images, paths, self.images, self._post, typed), thread=True, group="images")
        return True

    def attach_typed(self, box: PromptInput, text: str) -> None:
        """The box's /image lines: their images attached, the rest of the text left in the box."""
        try:
            paths, rest = attach.command_paths(text)
        except ValueError as exc:
            self.notify(str(exc), severity="warning")
            return
        if self.attach(paths, typed=True):
            box.load_text(rest)
            box.move_cursor(box.document.end)

    def action_attach_image(self) -> None:
        """The attach key: a dialog asks for the image's path."""
        if refused := self.backend.images_refused():
            self.notify(refused, severity="warning", timeout=20)
            return
        dialog = TextDialog(
            "Attach an image: its path", placeholder="~/Pictures/screenshot.png (quote paths with spaces)"
        )
        self.app.push_screen(dialog, callback=self.path_given)

    def path_given(self, path: str | None) -> None:
        if path and path.strip():
            self.attach(attach.typed_paths(path.strip()))
        self.query_one(PromptInput).focus()

    @on(PromptInput.ImagesPasted)
    def images_pasted(self, event: PromptInput.ImagesPasted) -> None:
        if not self.attach(event.paths):
            event.input.insert(event.text)  # the model reads no images: the paste is typed after all

    async def on_image_attached(self, message: messages.ImageAttached) -> None:
        event = message.event
        self.attaching = max(0, self.attaching - 1)
        if event.note:
            self.notify(event.note, severity="warning", timeout=15)
        same = next((image for image, _ in self.pending if image.digest == event.image.digest), None)
        if same is not None:
            self.notify(f"{event.image.name} is attached already (the same image as {same.name}).")
            return
        self.pending.append((event.image, event.preview))
        await self.show_pending()

    async def on_image_refused(self, message: messages.ImageRefused) -> None:
        event = message.event
        self.attaching = max(0, self.attaching - 1)
        self.notify(event.error, title="Image not attached", severity="error", timeout=20)
        if event.typed:  # the /image line goes back into the box, as it was typed
            box = self.query_one(PromptInput)
            line = f"{attach.COMMAND} {shlex.quote(event.path)}"
            box.load_text(f"{line}\n{box.text}" if box.text else line)
            box.move_cursor(box.document.end)

    def on_screen_suspend(self) -> None:
        image_preview.refresh_previews(self)  # behind a dialog: half-blocks (ui/widgets/image_preview.py)

    def on_screen_resume(self) -> None:
        image_preview.refresh_previews(self)

    async def show_pending(self) -> None:
        """The chips of the images the next message holds, previewed as this terminal can (the previews setting)."""
        protocol = terminal_graphics.protocol(self.settings.previews, os.environ)
        await self.query_one(PendingImages).show(self.pending, protocol)

    @on(ImageChip.Removed)
    async def image_removed(self, event: ImageChip.Removed) -> None:
        self.pending = [(image, preview) for image, preview in self.pending if image is not event.chip.image]
        await self.show_pending()
        self.query_one(PromptInput).focus()

    # the answer

    async def start_loop(self) -> None:
        """Answer the message as an agent loop: first the tool servers the chat needs, then the answer."""
        messages = self.conversation.messages
        first = bool(messages) and messages[-1].role == "user"  # else it goes on from tool results
        loop = self.loop = AgentLoop(self.conversation, self.servers, self.settings.mcp, first=first)
        starting = loop.servers_to_start()
        if not starting:
            await self.answer()
            return
        self.servers.start(starting)
        self.notify(f"Starting the tool server{'s' if len(starting) > 1 else ''} {', '.join(starting)}…")
        self.run_worker(partial(loop.wait_for_servers, starting, self._post), thread=True, group="tools")

    async def on_servers_waited(self, message: messages.ServersWaited) -> None:
        loop = message.event.loop
        if loop is not self.loop or loop.stopped:
            return
        states = self.servers.states()
        for name in message.event.names:
            if states[name].state != READY:
                why = states[name].error or "it did not start in time"
                self.notify(f"Tool server {name}: {why}. Its tools are left out.", severity="warning", timeout=20)
        await self.answer()

    async def answer(self) -> None:
        settings = self.settings
        turns = self.conversation.chat_turns(settings.system_prompt, images=not self.backend.images_refused())
        tools = self.loop.tool_use() if self.loop is not None else None
        message = Message("assistant", status=PARTIAL)
        self.conversation.messages.append(message)
        self.recorder.add(self.conversation, message)
        widget = await self.chat_view.add_assistant()
        request = AnswerRequest(
            self.conversation,
            turns,
            self.thinking,
            settings.sampling(),
            threading.Event(),
            draft=settings.draft,
            speculate=settings.speculate,
            tools=tools,
            images=self.images,
        )
        self.turn = Turn(self.conversation, message, widget, request, self.backend.model)
        self.backend.answer(request)

    async def on_prompt_sent(self, message: messages.PromptSent) -> None:
        self.last_prompt = message.event.prompt

    async def on_answer_chunk(self, message: messages.AnswerChunk) -> None:
        turn, chunk = self.turn, message.event
        if turn is None:
            return
        turn.message.thinking += chunk.thinking
        turn.message.content += chunk.answer
        if turn.widget.is_attached:
            await turn.widget.append(chunk.thinking, chunk.answer)
        self.panel.show_live(chunk.live, speculative=self.backend.speculative)
        now = time.monotonic()
        if now - turn.last_saved >= SAVE_EVERY_S:
            self.recorder.update(turn.conversation, turn.message)
            turn.last_saved = now

    async def on_answer_ended(self, message: messages.AnswerEnded) -> None:
        self.backend.answer_ended(message.event)
        turn, end = self.turn, message.event.end
        self.turn = None
        self.last_end = end
        if turn is None:
            return
        turn.message.thinking, turn.message.content = end.thinking, end.answer
        turn.message.status = END_STATUS.get(end.reason, ERROR)
        turn.message.note = (end.error or "") if turn.message.status != COMPLETE else ""
        turn.message.stats = end.stats
        turn.message.tool_calls = end.tool_calls
        self.recorder.update(turn.conversation, turn.message)
        if turn.widget.is_attached:
            await turn.widget.finish(turn.message, end.error)
            await turn.widget.show_calls(end.tool_calls)
        if end.stats is not None:
            self.panel.show_final(
                end.stats,
                thinking=turn.thinking,
                remote=self.backend.remote,
                source=end.acceptance_source,
                images=any(isinstance(t.get("content"), list) for t in turn.request.turns),  # parts: images
            )
        if end.error:
            self.notify(end.error, severity="error", timeout=15)
        await self.calls_made(turn, end.tool_calls, end.reason)

    # the agent loop (chat/agent.py): calls, their results, the next answer

    async def calls_made(self, turn: Turn, calls: tuple[ToolCall, ...], reason: str) -> None:
        """After an answer: its calls run (one by one, each after the user's yes), or the loop ends."""
        loop = self.loop if self.loop is not None and self.loop.conversation is turn.conversation else None
        finished = reason in ("stop", "length")
        if loop is None or not finished or not calls:  # stopped, failed, or answered in text: the loop ends
            why = results.stopped() if loop is None or reason == "cancelled" else results.not_run("the answer failed.")
            for call in calls:
                self.record_result(PendingCall(call, turn.conversation, None), why)
            if loop is not None:
                self.loop = None
            return
        over = loop.answered(calls)
        for pending, result in over:
            self.record_result(pending, result)
        if over:
            self.loop = None
            self.notify(
                f"This message used its {loop.limit} rounds of tool calls, so the latest calls were not run "
                "(the mcp.rounds setting).",
                severity="warning",
                timeout=20,
            )
            return
        await self.next_call(loop)

    async def next_call(self, loop: AgentLoop) -> None:
        """The next call of the round: refused at once, asked about, or run; none left: the next answer."""
        if loop is not self.loop or loop.stopped:
            return
        pending = loop.next_call()
        if pending is None:
            await self.answer()
            return
        refused = loop.refused(pending)
        if refused is not None:
            self.record_result(pending, refused)
            await self.next_call(loop)
        elif loop.asks(pending):
            loop.asking = pending
            self.show_call_state(pending, WAITING)
            assert pending.route is not None
            self.asking = ConfirmCallScreen(pending.call, *pending.route)
            self.app.push_screen(self.asking, callback=partial(self.decided, loop, pending))
        else:
            self.run_call(loop, pending)

    async def decided(self, loop: AgentLoop, pending: PendingCall, answer: str | None) -> None:
        """The user's answer about a call: yes, always (for that tool in this chat), no, or stop (Esc)."""
        self.asking = None
        loop.asking = None
        if loop is not self.loop or loop.stopped or answer not in (YES, NO, ALWAYS):
            self.record_result(pending, results.stopped())
            self.action_stop()
        elif answer == NO:
            self.record_result(pending, results.denied())
            await self.next_call(loop)
        else:  # YES or ALWAYS
            if answer == ALWAYS:
                loop.always(pending)
                self.recorder.save_tools(pending.conversation)
            self.run_call(loop, pending)

    def run_call(self, loop: AgentLoop, pending: PendingCall) -> None:
        loop.running = pending
        self.show_call_state(pending, RUNNING)
        self.run_worker(partial(loop.run, pending, self._post), thread=True, group="tools")

    async def on_tool_call_done(self, message: messages.ToolCallDone) -> None:
        loop, pending = message.event.loop, message.event.pending
        loop.running = None
        self.record_result(pending, message.event.result)  # kept even when the loop was stopped meanwhile
        await self.next_call(loop)

    def record_result(self, pending: PendingCall, result: ToolResult) -> None:
        """The call's result as a tool message of its chat (saved), and in its block if that chat is shown."""
        conversation = pending.conversation
        if conversation.result(pending.call.id) is not None:
            return
        message = AgentLoop.result_message(pending, result)
        conversation.messages.append(message)
        self.recorder.add(conversation, message)
        block = self.call_block(pending.call.id) if conversation is self.conversation else None
        if block is not None:
            block.show_result(message)

    def show_call_state(self, pending: PendingCall, state: str) -> None:
        block = self.call_block(pending.call.id)
        if block is not None:
            block.show_state(state)

    def call_block(self, call_id: str) -> ToolCallBlock | None:
        """The call's block in the chat shown (None once the screen is gone: the app quits)."""
        views = self.query(ChatView)
        return views.first().call_block(call_id) if views else None

    async def on_tool_server_changed(self, message: messages.ToolServerChanged) -> None:
        from dflash_chat.ui.tools_screen import ToolsScreen

        if isinstance(self.app.screen, ToolsScreen):
            await self.app.screen.show_servers()

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
        """Esc: the answer being written stops (what was written is kept), and so does the agent loop: a call
        running is cut, the calls not yet run are answered as not run."""
        if self.turn is not None:
            self.backend.stop(self.turn.request)
        loop, self.loop = self.loop, None
        if loop is None:
            return
        for pending, result in loop.stop():
            self.record_result(pending, result)
        asking, self.asking = self.asking, None
        if asking is not None and self.app.screen is asking:
            asking.dismiss(STOP)

    async def action_new_chat(self) -> None:
        self.action_stop()
        self.conversation = Conversation()
        self.backend.open_chat(self.conversation)
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
        self.conversation = conversation
        self.backend.open_chat(conversation)
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
        if not self._can_answer():
            return
        messages = self.conversation.messages
        if not messages:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        if messages[-1].role == "assistant" and not messages[-1].tool_calls:
            self.recorder.remove(self.conversation, messages.pop())
            widgets = self.chat_view.query(AssistantMessage)
            if widgets:
                await widgets.last().remove()
        await self.start_loop()

    def _last_answer(self) -> str | None:
        message = self.conversation.last("assistant")
        return message.content if message and message.content else None

    def action_copy_answer(self) -> None:
        self._copy(self._last_answer(), "the last answer", missing="No answer to copy yet.")

    def action_copy_code(self) -> None:
        code = last_code_block(self._last_answer() or "")
        self._copy(code, "the last code block", missing="The last answer has no code block.")

    def _copy(self, text: str | None, what: str, missing: str) -> None:
        if text is None:
            self.notify(missing, severity="warning")
            return
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied {what}")

    def action_focus_switch(self) -> None:
        prompt = self.query_one(PromptInput)
        (self.chat_view if prompt.has_focus else prompt).focus()

    def action_toggle_panel(self) -> None:
        self.panel.toggle_class("hidden")

    async def action_history(self) -> None:
        await self.app.run_action("open_history")  # the app's: it owns the screens above this one

    async def action_settings(self) -> None:
        await self.app.run_action("open_settings")

    async def action_tools(self) -> None:
        await self.app.run_action("open_tools")

    def tools_chosen(self, conversation: Conversation, tools) -> None:
        """After the tools screen: the chat's new choice of tools, saved with it."""
        if tools is not None and tools != conversation.tools:
            conversation.tools = tools
            self.recorder.save_tools(conversation)

    def apply_settings(self, new: Settings) -> None:
        """The one way settings change: this screen's, then the backend's (which may load another model)."""
        old, self.settings = self.settings, new
        if new.thinking != old.thinking:
            self.thinking = new.thinking
        try:
            reloading = self.backend.apply_settings(new)
        except UserError as exc:  # the model setting names nothing that can run
            self.notify(f"model: {exc}", severity="error", timeout=20)
            return
        if reloading:
            self.action_stop()  # the answer being written comes from the model being dropped
            self._model_changed()
