"""Asks before a tool call runs: the tool, its server and its arguments, and yes / no / always for this tool in
this chat. Esc stops the whole answer (the agent loop ends; what was written is kept)."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from dflash_chat.runtime.tool_calls import ToolCall
from dflash_chat.ui.widgets.tool_call_block import arguments_text

YES, NO, ALWAYS, STOP = "yes", "no", "always", "stop"


class ConfirmCallScreen(ModalScreen[str]):
    """Dismisses with YES, NO, ALWAYS or STOP."""

    BINDINGS = [
        Binding("y", "answer('yes')", "Run it", id="call-yes"),
        Binding("n", "answer('no')", "Don't run it", id="call-no"),
        Binding("a", "answer('always')", "Always in this chat", id="call-always"),
        Binding("escape", "answer('stop')", "Stop the answer", id="call-stop"),
    ]

    def __init__(self, call: ToolCall, server: str, tool: str) -> None:
        super().__init__(classes="dialog")
        self.call = call
        self.server = server
        self.tool = tool

    def compose(self):
        with Vertical(classes="dialog-box", id="call-box"):
            yield Label(f"Run {self.tool} from {self.server}?", classes="dialog-title", markup=False)
            with VerticalScroll(id="call-arguments"):
                yield Static(arguments_text(self.call), markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Yes (y)", variant="primary", id="yes")
                yield Button("No (n)", id="no")
                yield Button("Always in this chat (a)", id="always")
            yield Label(
                "No sends the model that you declined. Esc stops the answer.", classes="dialog-hint", markup=False
            )

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(str(event.button.id))

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)
