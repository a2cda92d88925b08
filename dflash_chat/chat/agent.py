"""The agent loop of one message: the model answers; when the answer calls tools, each call runs only after the
user's yes (or an earlier "always" for that tool in this chat), its result goes back to the model as a `tool`
turn, and the model answers again, until it answers in text, the message has used its rounds of tool calls
(`[mcp] rounds`), or the user stops it (Esc).

The loop is plain state on the UI thread; the chat screen drives it (ui/chat_screen.py: it shows the calls,
asks, starts the answers). Its blocking work, waiting for servers to start and running a call, is worker
bodies here that report through `post` (ServersWaited, ToolCallDone in chat/events.py) and leave as soon as
`cancel` is set. Every call the model made gets a result, whatever happens (declined, stopped, over the
limit), so the chat always reads back as the model and an OpenAI-compatible server expect it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from dflash_chat.chat.conversation import Conversation, Message
from dflash_chat.chat.tools import results
from dflash_chat.chat.tools.choice import Offered, key
from dflash_chat.chat.tools.results import ToolResult
from dflash_chat.chat.tools.servers import OFF, STARTING, ToolServers
from dflash_chat.mcp_config import McpSettings
from dflash_chat.runtime.tool_calls import ToolCall
from dflash_chat.runtime.tool_use import ToolUse

# what the loop's workers post


@dataclass(frozen=True)
class ServersWaited:
    """The servers a loop's chat needs have started, or failed to, or the wait was stopped."""

    loop: AgentLoop
    names: tuple[str, ...]  # the servers waited for


@dataclass(frozen=True)
class ToolCallDone:
    """A tool call ran (or was stopped): its result, for the conversation the call belongs to."""

    loop: AgentLoop
    pending: PendingCall
    result: ToolResult


Post = Callable[[ServersWaited | ToolCallDone], None]  # the chat screen's, for any backend event


@dataclass(frozen=True)
class PendingCall:
    """A call the model made, waiting to run: the answer it belongs to, and where it runs (None: nowhere, the
    name is not one the answer offered)."""

    call: ToolCall
    conversation: Conversation
    route: tuple[str, str] | None  # (server, the tool's name there)

    @property
    def key(self) -> str:
        return key(*self.route) if self.route is not None else ""

    @property
    def server(self) -> str:
        return self.route[0] if self.route is not None else ""


class AgentLoop:
    def __init__(
        self, conversation: Conversation, servers: ToolServers, settings: McpSettings, *, first: bool = True
    ) -> None:
        self.conversation = conversation
        self.servers = servers
        self.limit = settings.rounds
        self.timeout = settings.timeout
        self.rounds = 0  # answers whose calls ran (or were asked about) so far
        self.first = first  # the next answer is the first to the message (not one after tool results)
        self.offered: Offered | None = None  # what the latest answer offered
        self.queue: list[PendingCall] = []  # the latest answer's calls not yet run
        self.asking: PendingCall | None = None  # the call the user is asked about
        self.running: PendingCall | None = None  # the call running
        self.cancel = threading.Event()  # Esc: the wait for servers and a running call stop
        self.stopped = False

    # before an answer

    def servers_to_start(self) -> list[str]:
        """The enabled servers this chat offers tools from that have not started (or failed) yet."""
        states = self.servers.states()
        wanted = self.conversation.tools.servers(self.servers.enabled())
        return [name for name in wanted if states[name].state in (OFF, STARTING)]

    def wait_for_servers(self, names: list[str], post: Post) -> None:
        """A worker body: until these servers are ready or failed (or Esc), then ServersWaited."""
        self.servers.wait(names, self.cancel)
        post(ServersWaited(self, tuple(names)))

    def tool_use(self) -> ToolUse | None:
        """What the next answer offers (None: no tools), from the tools the ready servers list now."""
        self.offered = self.conversation.tools.offer(self.servers.tools(), first=self.first)
        self.first = False
        return self.offered.use if self.offered is not None else None

    # after an answer

    def answered(self, calls: tuple[ToolCall, ...]) -> list[tuple[PendingCall, ToolResult]]:
        """The answer made these calls: they are queued to run, or, past the round limit, answered at once
        (returned: each call and its result)."""
        pending = [
            PendingCall(call, self.conversation, self.offered.route(call.name) if self.offered else None)
            for call in calls
        ]
        if self.rounds >= self.limit:
            return [(p, results.skipped(self.limit)) for p in pending]
        self.rounds += 1
        self.queue = pending
        return []

    def next_call(self) -> PendingCall | None:
        return self.queue.pop(0) if self.queue else None

    def refused(self, pending: PendingCall) -> ToolResult | None:
        """The result of a call that cannot run at all (an unknown tool, arguments that are not an object)."""
        if pending.route is None:
            return results.not_run(f"no tool named {pending.call.name!r} is offered in this chat.")
        try:
            pending.call.args()
        except ValueError:
            return results.not_run(f"the arguments are not a JSON object: {results.cut(pending.call.arguments, 200)}")
        return None

    def asks(self, pending: PendingCall) -> bool:
        """Whether the user is asked before this call runs (not after "always" for its tool in this chat)."""
        return pending.key not in self.conversation.tools.always

    def always(self, pending: PendingCall) -> None:
        """The user's "always for this tool in this chat" (saved with the chat by the caller)."""
        tools = self.conversation.tools
        self.conversation.tools = replace(tools, always=tools.always | {pending.key})

    def run(self, pending: PendingCall, post: Post) -> None:
        """A worker body: run the call (the user said yes) and post its result."""
        assert pending.route is not None, "run() of a call refused()"
        server, tool = pending.route
        result = self.servers.call(server, tool, pending.call.args(), self.timeout, self.cancel)
        post(ToolCallDone(self, pending, result))

    @staticmethod
    def result_message(pending: PendingCall, result: ToolResult) -> Message:
        """The tool turn that answers the call (what the model reads back)."""
        return Message("tool", result.text, status=result.status, tool_call_id=pending.call.id)

    def stop(self) -> list[tuple[PendingCall, ToolResult]]:
        """Esc: the loop ends. Returned: a result for each call it had not finished: the one running is cut
        (its worker stops at once; what it posts later is a second result, dropped), the one asked about and
        those queued were not run."""
        self.stopped = True
        self.cancel.set()
        unfinished = [(p, results.cut_off()) for p in (self.running,) if p is not None]
        unfinished += [(p, results.stopped()) for p in (self.asking, *self.queue) if p is not None]
        self.queue, self.asking, self.running = [], None, None
        return unfinished
