"""The MCP servers of config.toml's [mcp] table, how each stands, its tools, and which of them this chat offers.

Opening the screen starts the enabled servers (their tools are listed once they answer); a server's state
changes as it happens (the chat screen hands each ServerChanged on). A checkbox per tool says whether this
chat offers it; "Call first" makes the first answer to each message call one tool. The choice is this chat's
and is saved with it: the screen dismisses with the chat's new ChatTools.
"""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Checkbox, Footer, Label, Select, Static

from dflash_chat.chat.tools.choice import AUTO, ChatTools, key
from dflash_chat.chat.tools.servers import DISABLED, FAILED, OFF, READY, STARTING, ServerState, ToolServers
from dflash_chat.ui.notices import PlainNotices

STATES = {
    DISABLED: "disabled in config.toml (enabled = false)",
    OFF: "not started",
    STARTING: "starting…",
    READY: "ready",
    FAILED: "failed",
}
NO_SERVERS = (
    "No MCP servers are set up. Add one to config.toml, e.g.\n\n"
    '  [mcp.servers.files]\n  command = "npx"\n'
    '  args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]\n\n'
    "or: dflash-chat --set mcp.servers.files.command=npx (see the README)."
)


class ToolCheckbox(Checkbox):
    """A tool's checkbox: ticked when this chat offers it."""

    def __init__(self, tool_key: str, label: Text, value: bool) -> None:
        super().__init__(label, value, classes="tool-box")
        self.tool_key = tool_key


class ToolsScreen(PlainNotices, Screen[ChatTools]):
    """Dismisses with the chat's tool choice (changed or not)."""

    BINDINGS = [
        Binding("escape", "close", "Back", id="tools-close"),
        Binding("r", "restart", "Restart failed", id="tools-restart"),
        Binding("c", "forget", "Ask before every call", id="tools-forget"),
    ]

    def __init__(self, servers: ToolServers, tools: ChatTools) -> None:
        super().__init__()
        self.servers = servers
        self.tools = tools
        self._shown: dict[str, ServerState] = {}

    def compose(self):
        yield Label("Tools", id="tools-title")
        yield Static("", id="tools-note", markup=False)
        yield VerticalScroll(id="tools-list")
        with Horizontal(id="tools-choice-row"):
            yield Label("Call first", classes="field-name")
            yield Select([("the model decides", AUTO)], value=AUTO, allow_blank=False, id="tools-choice")
        yield Footer()

    async def on_mount(self) -> None:
        self.servers.start(self.servers.enabled())
        await self.show_servers()

    def note(self) -> str:
        if not self.servers.states():
            return NO_SERVERS
        asked = f"; {len(self.tools.always)} run without asking (c: ask again)" if self.tools.always else ""
        return f"Ticked tools are offered in this chat; each call asks before it runs{asked}."

    async def show_servers(self) -> None:
        """Show each server whose state changed since last shown (all of them the first time)."""
        self.query_one("#tools-note", Static).update(self.note())
        listing = self.query_one("#tools-list", VerticalScroll)
        for name, state in self.servers.states().items():
            if self._shown.get(name) == state:
                continue
            self._shown[name] = state
            section = next((s for s in listing.query(".tool-server") if s.id == f"server-{name}"), None)
            widgets = self._server_widgets(state)
            if section is None:
                await listing.mount(Vertical(*widgets, id=f"server-{name}", classes="tool-server"))
            else:
                await section.remove_children()
                await section.mount_all(widgets)
        self._show_choices()

    def _server_widgets(self, state: ServerState) -> list:
        header = Text(state.name, style="bold")
        header.append(f"  {STATES.get(state.state, state.state)}")
        if state.state == READY:
            header.append(f" · {len(state.tools)} tool{'s' if len(state.tools) != 1 else ''}")
        widgets: list = [Label(header, classes="tool-server-name"), Label(Text(state.where), classes="tool-where")]
        if state.error:
            widgets.append(Label(Text(state.error), classes="tool-error"))
        for tool in state.tools:
            label = Text(tool.name, style="bold")
            if tool.description:
                first = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
                label.append(f" — {first[:100]}")
            tool_key = key(state.name, tool.name)
            if tool_key in self.tools.always:
                label.append(" (runs without asking)", style="italic")
            widgets.append(ToolCheckbox(tool_key, label, self.tools.offers(tool_key)))
        return widgets

    def _every_key(self) -> list[str]:
        return [key(name, tool.name) for name, tools in self.servers.tools().items() for tool in tools]

    def _show_choices(self) -> None:
        """The tools the first answer may be made to call: those offered."""
        select = self.query_one("#tools-choice", Select)
        offered = [k for k in self._every_key() if self.tools.offers(k)]
        options = [("the model decides", AUTO)] + [(f"{k.split('/', 1)[1]} ({k.split('/', 1)[0]})", k) for k in offered]
        choice = self.tools.choice if self.tools.choice in offered else AUTO
        with select.prevent(Select.Changed):
            select.set_options(options)
            select.value = choice

    @on(Checkbox.Changed, ".tool-box")
    def ticked(self, event: Checkbox.Changed) -> None:
        box = event.checkbox
        assert isinstance(box, ToolCheckbox)
        self.tools = self.tools.with_offered(box.tool_key, event.value, self._every_key())
        self._show_choices()

    @on(Select.Changed, "#tools-choice")
    def chosen(self, event: Select.Changed) -> None:
        self.tools = replace(self.tools, choice=str(event.value))

    def action_restart(self) -> None:
        failed = [name for name, state in self.servers.states().items() if state.state == FAILED]
        if not failed:
            self.notify("No server has failed.")
            return
        self.servers.start(failed)

    async def action_forget(self) -> None:
        if not self.tools.always:
            self.notify("Every call already asks before it runs.")
            return
        self.tools = replace(self.tools, always=frozenset())
        self._shown.clear()
        await self.show_servers()
        self.notify("Every call in this chat asks before it runs again.")

    def action_close(self) -> None:
        self.dismiss(self.tools)
