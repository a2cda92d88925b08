"""A chat's choice of tools: which it offers the model, which run without asking, and a tool the first answer
to each message must call. Saved with the chat (chat/history.py) as a small JSON object.

A tool is named by its key, "SERVER/TOOL" (`key`). A chat that never chose (`offered` None) offers every tool
of the enabled servers, so servers added later are offered too; once the user ticks or unticks a tool in the
tools screen, the chat keeps exactly the tools it then offered.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from dflash_chat.runtime.tool_calls import ToolSpec
from dflash_chat.runtime.tool_use import ToolUse

AUTO = "auto"


def key(server: str, tool: str) -> str:
    return f"{server}/{tool}"


def split_key(tool_key: str) -> tuple[str, str]:
    server, _, tool = tool_key.partition("/")
    return server, tool


@dataclass(frozen=True)
class Offered:
    """The tools one answer offers: the ToolUse the model gets, and for each name it may call, the server and
    the tool's own name there (two servers' tools of one name are told apart as SERVER__TOOL)."""

    use: ToolUse
    routes: Mapping[str, tuple[str, str]]

    def route(self, name: str) -> tuple[str, str] | None:
        return self.routes.get(name)


@dataclass(frozen=True)
class ChatTools:
    offered: frozenset[str] | None = None  # tool keys; None: every tool of the enabled servers
    always: frozenset[str] = frozenset()  # tool keys that run without asking, in this chat
    choice: str = AUTO  # AUTO, or a tool key the first answer to each message must call

    def offers(self, tool_key: str) -> bool:
        return self.offered is None or tool_key in self.offered

    def servers(self, enabled: Iterable[str]) -> list[str]:
        """The enabled servers this chat needs started: those with a tool it may offer."""
        wanted = None if self.offered is None else {split_key(k)[0] for k in self.offered}
        return [name for name in enabled if wanted is None or name in wanted]

    def with_offered(self, tool_key: str, on: bool, every: Iterable[str]) -> ChatTools:
        """The choice with one tool ticked or unticked; `every`: the tool keys known now (what None offered)."""
        offered = set(every if self.offered is None else self.offered)
        (offered.add if on else offered.discard)(tool_key)
        choice = self.choice if self.choice == AUTO or self.choice in offered else AUTO
        return replace(self, offered=frozenset(offered), choice=choice)

    def offer(self, tools: Mapping[str, Sequence[ToolSpec]], *, first: bool) -> Offered | None:
        """What one answer offers, from the tools each ready server lists (server -> its tools); None when it
        offers none. `first`: the first answer to a message, the one a chosen tool must be called in (the
        answers after tool results choose freely, or the loop could never end)."""
        specs: list[ToolSpec] = []
        routes: dict[str, tuple[str, str]] = {}
        names = [tool.name for listed in tools.values() for tool in listed]
        forced = ""
        for server, listed in tools.items():
            for tool in listed:
                if not self.offers(key(server, tool.name)):
                    continue
                name = tool.name if names.count(tool.name) == 1 else f"{server}__{tool.name}"
                specs.append(ToolSpec(name, tool.description, tool.parameters))
                routes[name] = (server, tool.name)
                if key(server, tool.name) == self.choice:
                    forced = name
        if not specs:
            return None
        return Offered(ToolUse(tuple(specs), forced if first and forced else AUTO), routes)

    # saved with the chat

    def to_json(self) -> str | None:
        """None for a chat that never chose (what a new chat does)."""
        if self == ChatTools():
            return None
        return json.dumps(
            {
                "offered": sorted(self.offered) if self.offered is not None else None,
                "always": sorted(self.always),
                "choice": self.choice,
            }
        )

    @staticmethod
    def from_json(text: str | None) -> ChatTools:
        """What was saved; what cannot be read (hand-edited, another version) reads as the default."""
        try:
            value = json.loads(text) if text else {}
        except (ValueError, RecursionError):
            return ChatTools()
        if not isinstance(value, dict):
            return ChatTools()
        offered, always, choice = _keys(value.get("offered")), _keys(value.get("always")), value.get("choice")
        return ChatTools(offered, always or frozenset(), choice if isinstance(choice, str) and choice else AUTO)


def _keys(value: object) -> frozenset[str] | None:
    """A saved list of tool keys (None: not one)."""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return frozenset(value)
    return None
