"""How an answer may call tools: the tools offered, the choice among them, and whether several calls may come
at once. `serve` makes one from a request body, the chat app from the tools a chat offers; runtime/prompt.py
renders it into the prompt (the model's own template, with `tools=`) and runtime/session.py parses the calls
out of the answer (runtime/tool_calls.py).

`required` and a named tool are enforced without constrained decoding: the assistant's turn is opened with
the call's first words (`call_opening`), which are prompt tokens, so they hold for any model and speculative
decoding stays exact. With thinking on, that turn's think block is closed first: a forced call is written
without thinking.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_chat.runtime.tool_calls import ToolSpec, call_opening

CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolUse:
    tools: tuple[ToolSpec, ...]
    choice: str = "auto"  # auto | none | required | the name of one of `tools`
    parallel: bool = True  # several calls in one answer (False: the answer ends after the first)

    @property
    def offered(self) -> bool:
        """Whether the model is told of the tools and its calls are parsed ("none" offers nothing)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.offered and self.choice != "auto"

    def opening(self) -> str:
        """The text that opens the assistant's turn: a forced call's first words, or nothing."""
        if not self.forced:
            return ""
        return call_opening(None if self.choice == "required" else self.choice)

    def template_tools(self) -> list[dict] | None:
        """The tools as the chat template takes them (OpenAI's shape), or None when none are offered."""
        return [tool.as_openai() for tool in self.tools] if self.offered else None
