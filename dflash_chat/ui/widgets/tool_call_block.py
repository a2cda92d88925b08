"""One tool call in an answer, as a collapsible block: the tool and how the call stands in its title, the
arguments, then the result (what the model reads back; a long one is shown cut, the model gets it whole up
to chat/tools/results.py's limit)."""

from __future__ import annotations

import json

from textual.widgets import Collapsible, Static

from dflash_chat.chat.conversation import Message
from dflash_chat.chat.markdown import call_state
from dflash_chat.runtime.tool_calls import ToolCall

SHOWN_CHARS = 2_000  # of a result, on screen

WAITING, RUNNING = "waiting for your answer", "running…"


def arguments_text(call: ToolCall) -> str:
    """The arguments as indented JSON (as sent, when they are not JSON)."""
    try:
        return json.dumps(json.loads(call.arguments), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return call.arguments


def shown_result(text: str) -> str:
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}\n… ({len(text) - SHOWN_CHARS:,} more characters, sent to the model)"


class ToolCallBlock(Collapsible):
    def __init__(self, call: ToolCall, result: Message | None = None, *, collapsed: bool = False) -> None:
        self.call = call
        self._result = Static(shown_result(result.content) if result else "", classes="tool-result", markup=False)
        self._result.display = result is not None
        super().__init__(
            Static(arguments_text(call), classes="tool-args", markup=False),
            self._result,
            title=self._heading(call_state(result.status) if result else WAITING),
            collapsed=collapsed,
            classes="tool-call",
        )

    def _heading(self, state: str) -> str:
        return f"⚙ {self.call.name} · {state}"

    def show_state(self, state: str) -> None:
        """How the call stands while it has no result: WAITING or RUNNING."""
        self.title = self._heading(state)

    def show_result(self, result: Message) -> None:
        self.title = self._heading(call_state(result.status))
        self._result.update(shown_result(result.content))
        self._result.display = True
        self.set_class(result.status != "complete", "tool-failed")
