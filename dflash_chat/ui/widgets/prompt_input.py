"""The message box: multi-line; Enter sends, Shift+Enter / Ctrl+J add a line,
Up/Down on the first/last line walk through earlier prompts. A paste that is only the paths of image files (a
file dropped on the terminal) attaches them instead of typing them (chat/attach.py)."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from dflash_chat.chat.attach import pasted_paths
from dflash_chat.ui.paste import clean

NEWLINE_KEYS = ("shift+enter", "ctrl+j")


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        input: PromptInput
        text: str

    @dataclass
    class ImagesPasted(Message):
        input: PromptInput
        paths: list[str]
        text: str  # as pasted (cleaned)

    def __init__(self, prompts: list[str] | None = None, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.prompts: list[str] = list(prompts or [])
        self._browse: int | None = None  # index into prompts while walking with Up/Down
        self._draft = ""  # what was typed before walking started

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        await super()._on_key(event)

    async def _on_paste(self, event: events.Paste) -> None:
        # runs before TextArea's own handler (Textual dispatches along the MRO), which inserts event.text
        event.text = clean(event.text)  # pasted control characters never reach the message
        paths = pasted_paths(event.text)
        if paths:
            event.prevent_default()  # TextArea's handler would type the paths
            self.post_message(self.ImagesPasted(self, paths, event.text))

    def remember(self, text: str) -> None:
        if text and (not self.prompts or self.prompts[-1] != text):
            self.prompts.append(text)
        self._browse = None

    def action_cursor_up(self, select: bool = False) -> None:
        if select or self.cursor_location[0] > 0 or not self.prompts:
            super().action_cursor_up(select)
            return
        if self._browse is None:
            self._draft = self.text
            self._browse = len(self.prompts)
        if self._browse > 0:
            self._browse -= 1
            self._show(self.prompts[self._browse])

    def action_cursor_down(self, select: bool = False) -> None:
        last_row = self.document.line_count - 1
        if select or self._browse is None or self.cursor_location[0] < last_row:
            super().action_cursor_down(select)
            return
        self._browse += 1
        if self._browse >= len(self.prompts):
            self._browse = None
            self._show(self._draft)
        else:
            self._show(self.prompts[self._browse])

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)
