"""The conversation: user messages and streamed Markdown answers, pinned to the bottom."""

from __future__ import annotations

from collections.abc import Mapping

from textual.containers import Vertical, VerticalScroll
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream

from dflash_chat.chat.conversation import COMPLETE, Conversation, Message
from dflash_chat.chat.images import Attachment
from dflash_chat.chat.markdown import status_note
from dflash_chat.runtime.tool_calls import ToolCall
from dflash_chat.ui.widgets.image_chips import MessageImages
from dflash_chat.ui.widgets.tool_call_block import ToolCallBlock


class UserMessage(Vertical):
    """What the user sent: its images as chips (ui/widgets/image_chips.py), then its text."""

    def __init__(self, text: str, images: tuple[Attachment, ...] = ()) -> None:
        super().__init__(classes="message user")
        self.text = text
        self.images = images
        self.border_title = "you"

    def compose(self):
        if self.images:
            yield MessageImages(self.images)
        yield Markdown(self.text)


class AssistantMessage(Vertical):
    """Thinking (collapsible, collapsed once the answer starts) above the answer, then a block for each
    tool call it made (with the call's result, from `results`: the tool messages by call id)."""

    def __init__(self, message: Message | None = None, results: Mapping[str, Message] | None = None) -> None:
        super().__init__(classes="message assistant")
        self.border_title = "assistant"
        self._initial = message
        self._results = results or {}
        self._thinking_stream: MarkdownStream | None = None
        self._answer_stream: MarkdownStream | None = None

    def compose(self):
        message = self._initial
        thinking = message.thinking if message else ""
        with Collapsible(title="thinking", collapsed=bool(message), classes="thinking") as box:
            box.display = bool(thinking)
            yield Markdown(thinking, classes="thinking-text")
        yield Markdown(message.content if message else "", classes="answer")
        with Vertical(classes="tool-calls"):
            for call in message.tool_calls if message else ():
                yield ToolCallBlock(call, self._results.get(call.id), collapsed=True)
        yield Static("", classes="status", markup=False)  # holds error text

    def on_mount(self) -> None:
        if self._initial is not None:
            self.show_status(self._initial)

    @property
    def thinking_box(self) -> Collapsible:
        return self.query_one(".thinking", Collapsible)

    @property
    def answer(self) -> Markdown:
        return self.query_one(".answer", Markdown)

    async def append(self, thinking: str, answer: str) -> None:
        if thinking:
            if self._thinking_stream is None:
                self.thinking_box.display = True
                self.thinking_box.collapsed = False
                self._thinking_stream = Markdown.get_stream(self.query_one(".thinking-text", Markdown))
            await self._thinking_stream.write(thinking)
        if answer:
            if self._answer_stream is None:
                self.thinking_box.collapsed = True
                self._answer_stream = Markdown.get_stream(self.answer)
            await self._answer_stream.write(answer)

    async def finish(self, message: Message, error: str | None = None) -> None:
        """Stop streaming and set the whole text once (streamed fences can render short)."""
        for stream in (self._thinking_stream, self._answer_stream):
            if stream is not None:
                await stream.stop()
        self._thinking_stream = self._answer_stream = None
        if message.thinking:
            self.thinking_box.display = True
            self.thinking_box.collapsed = bool(message.content)
            await self.query_one(".thinking-text", Markdown).update(message.thinking)
        await self.answer.update(message.content)
        self.show_status(message, error)

    async def show_calls(self, calls: tuple[ToolCall, ...]) -> None:
        """A block for each call the answer made, waiting for the user's answer."""
        if calls:
            await self.query_one(".tool-calls", Vertical).mount_all([ToolCallBlock(call) for call in calls])

    def show_status(self, message: Message, error: str | None = None) -> None:
        status = self.query_one(".status", Static)
        if message.status == COMPLETE:
            status.update("")
            status.display = False
            return
        why = error or message.note
        status.update(f"({status_note(message.status)}{': ' + why if why else ''})")
        status.display = True


class Notice(Static):
    """A line of guidance shown in an empty chat (no model yet, how to start)."""


class ChatView(VerticalScroll):
    can_focus = True

    def on_mount(self) -> None:
        self.anchor()

    async def show(self, conversation: Conversation, notice: str = "") -> None:
        await self.remove_children()
        results = {m.tool_call_id: m for m in conversation.messages if m.role == "tool"}
        widgets = [self._widget_for(m, results) for m in conversation.messages if m.role != "tool"]
        if notice and not widgets:
            widgets.append(Notice(notice, classes="notice", markup=False))  # paths, model errors
        if widgets:
            await self.mount_all(widgets)
        self.anchor()

    async def add_user(self, message: Message) -> UserMessage:
        await self.query(Notice).remove()
        widget = UserMessage(message.content, message.images)
        await self.mount(widget)
        self.anchor()
        return widget

    async def add_assistant(self) -> AssistantMessage:
        widget = AssistantMessage()
        await self.mount(widget)
        self.anchor()
        return widget

    def call_block(self, call_id: str) -> ToolCallBlock | None:
        """The block of a call shown in this chat (None: not shown, e.g. another chat is open)."""
        return next((b for b in self.query(ToolCallBlock) if b.call.id == call_id), None)

    @staticmethod
    def _widget_for(message: Message, results: Mapping[str, Message]):
        if message.role == "user":
            return UserMessage(message.content, message.images)
        return AssistantMessage(message, results)
