"""The MCP servers of the settings' [mcp] table, started when a chat first needs them, called by the agent loop.

Each server is one MCP SDK client, `async with` its transport (a command on stdio, or a URL over streamable
HTTP) and a ClientSession, held open on one asyncio loop in a daemon thread ("dflash-mcp") until the app
quits. Nothing here blocks the UI thread: `start` and `close` only schedule work on that loop, and the
blocking calls (`wait`, `call`) are for worker threads, which they leave as soon as their cancel flag is set.
Quitting never waits on a server: `close` asks each to stop (the SDK closes its stdin, then ends its process
group), and the thread, a daemon, does not hold the app.

A command gets exactly the variables its `env` names, besides PATH and HOME from the user's environment (the
SDK adds its own short list of harmless ones: LOGNAME, SHELL, TERM, USER), never the whole environment. Its
stderr goes to `mcp-NAME.log` in the data folder, never onto the screen, and so does each line it prints on stdout
that is not an MCP message (one line in the log each; the SDK's own traceback for it is kept off stderr). Each change of a server's state is
posted as a ServerChanged (from the loop's thread: `post` must not block).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_chat.chat.tools import results
from dflash_chat.chat.tools.results import ToolResult
from dflash_chat.errors import one_line
from dflash_chat.mcp_config import McpServer, McpSettings
from dflash_chat.runtime.tool_calls import ToolSpec

START_S = 30.0  # for a server to start and list its tools
POLL_S = 0.05  # how often a waiting worker looks at its cancel flag
INHERITED = ("PATH", "HOME")  # the only variables of the user's environment a server gets

# a server's states
DISABLED, OFF, STARTING, READY, FAILED = "disabled", "off", "starting", "ready", "failed"


@dataclass(frozen=True)
class ServerState:
    """What the tools screen shows of one server."""

    name: str
    state: str  # DISABLED, OFF (starts when a chat needs it), STARTING, READY or FAILED
    where: str  # its command line or URL
    tools: tuple[ToolSpec, ...] = ()
    error: str = ""  # why it failed, in words
    log: str = ""  # its stderr log (stdio servers)


@dataclass(frozen=True)
class ServerChanged:
    """A server's state changed (posted from the servers' thread)."""

    state: ServerState


class ToolServers:
    def __init__(self, settings: McpSettings, log_dir: Path, environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.environ = dict(os.environ if environ is None else environ)
        self.post: Callable[[ServerChanged], None] = lambda event: None
        self._states = {
            name: ServerState(
                name, OFF if server.enabled else DISABLED, server.where(), log=self._log_name(name, server)
            )
            for name, server in settings.servers.items()
        }
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stops: dict[str, asyncio.Event] = {}  # a running server's: set, it stops
        self._sessions: dict[str, Any] = {}  # a ready server's ClientSession
        self._closed = False

    def attach(self, post: Callable[[ServerChanged], None]) -> None:
        self.post = post

    # what the screens read (any thread)

    def states(self) -> dict[str, ServerState]:
        with self._lock:
            return dict(self._states)

    def enabled(self) -> list[str]:
        return [name for name, server in self.settings.servers.items() if server.enabled]

    def tools(self) -> dict[str, tuple[ToolSpec, ...]]:
        """The tools of each ready server, by server."""
        return {name: state.tools for name, state in self.states().items() if state.state == READY}

    # UI thread: never blocks

    def start(self, names: Iterable[str]) -> None:
        """Start these servers (those enabled and not running or starting already)."""
        for name in names:
            state = self.states().get(name)
            if self._closed or state is None or state.state not in (OFF, FAILED):
                continue
            self._set(name, STARTING)
            loop = self._running_loop()
            loop.call_soon_threadsafe(functools.partial(self._begin, name))

    def close(self) -> None:
        """The app quits: every server is asked to stop, and nothing waits for it."""
        self._closed = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop_all)

    # worker threads: blocking, left at once when `cancel` is set

    def wait(self, names: Iterable[str], cancel: threading.Event, timeout: float = START_S + 5) -> None:
        """Until each of these servers is ready or failed (or `timeout` passes, or `cancel` is set)."""
        names = list(names)
        deadline = time.monotonic() + timeout
        while not cancel.is_set() and time.monotonic() < deadline:
            states = self.states()
            if all(states[name].state not in (STARTING, OFF) for name in names if name in states):
                return
            cancel.wait(POLL_S)

    def call(self, server: str, tool: str, arguments: dict, timeout: float, cancel: threading.Event) -> ToolResult:
        """Call `tool` on `server`; every outcome is a ToolResult (a failure, the timeout, Esc included)."""
        session = self._sessions.get(server)
        loop = self._loop
        if session is None or loop is None or self._closed:
            state = self.states().get(server)
            why = f" ({state.error})" if state is not None and state.error else ""
            return results.not_run(f"the tool server {server!r} is not running{why}.")
        future = asyncio.run_coroutine_threadsafe(self._call(session, tool, arguments, timeout), loop)
        deadline = time.monotonic() + timeout + 5  # the SDK's own timeout ends it first; this is a backstop
        while True:
            try:
                return future.result(POLL_S)
            except concurrent.futures.TimeoutError:
                pass
            except concurrent.futures.CancelledError:
                return results.cut_off()
            if cancel.is_set() or self._closed:
                future.cancel()
                return results.cut_off()
            if time.monotonic() > deadline:
                future.cancel()
                return results.timed_out(timeout)

    # the servers' thread

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="dflash-mcp", daemon=True).start()
            return self._loop

    def _set(self, name: str, state: str, **changes: Any) -> None:
        with self._lock:
            old = self._states[name]
            new = ServerState(name, state, old.where, changes.get("tools", ()), changes.get("error", ""), old.log)
            self._states[name] = new
        if not self._closed:
            self.post(ServerChanged(new))

    def _begin(self, name: str) -> None:
        stop = self._stops[name] = asyncio.Event()
        asyncio.get_running_loop().create_task(self._run(name, self.settings.servers[name], stop))

    def _stop_all(self) -> None:
        for stop in self._stops.values():
            stop.set()

    async def _run(self, name: str, server: McpServer, stop: asyncio.Event) -> None:
        """Hold one server open until `stop`: its transport and session entered and left in this one task."""
        log = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if server.url:
                    transport = _http_transport(server.url)
                else:
                    log = stack.enter_context(self._open_log(name, server))
                    transport = self._stdio_transport(server, log)
                session = await _session(stack, transport, functools.partial(_log_bad_message, log))
                listed = await _listed_tools(session)
                self._sessions[name] = session
                self._set(name, READY, tools=listed)
                await stop.wait()
        except Exception as exc:  # noqa: BLE001 - any failure of a server is said in words on its line
            self._set(name, FAILED, error=self._why(name, server, exc))
        finally:
            self._sessions.pop(name, None)
        if stop.is_set() and not self._closed:
            self._set(name, OFF)

    def _stdio_transport(self, server: McpServer, log):
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        env = {key: self.environ[key] for key in INHERITED if key in self.environ} | dict(server.env)
        command = shutil.which(server.command, path=env.get("PATH")) or server.command
        if not Path(command).exists():
            raise FileNotFoundError(f"the command {server.command!r} was not found on PATH")
        return stdio_client(StdioServerParameters(command=command, args=list(server.args), env=env), errlog=log)

    def _log_name(self, name: str, server: McpServer) -> str:
        return "" if server.url else str(self.log_dir / f"mcp-{name}.log")

    @contextlib.contextmanager
    def _open_log(self, name: str, server: McpServer):
        """The server's log, for its stderr; where it cannot be written (a read-only data folder), nowhere:
        a server's output never reaches the screen."""
        path = Path(self._log_name(name, server))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            log = open(path, "a", encoding="utf-8")
        except OSError:
            log = open(os.devnull, "w", encoding="utf-8")
        with log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {server.where()}\n")
            log.flush()
            yield log

    def _why(self, name: str, server: McpServer, exc: BaseException) -> str:
        """Why a server did not start or stopped, in one line that says what to do."""
        exc = _innermost(exc)
        log = f" (its log: {self._log_name(name, server)})" if not server.url else ""
        if isinstance(exc, FileNotFoundError):
            return f"{exc}: install it, or give its full path as [mcp.servers.{name}] command"
        if isinstance(exc, PermissionError):
            return f"the command {server.command!r} cannot be run (permission denied)"
        if isinstance(exc, TimeoutError):
            return f"it did not answer within {START_S:g} s of starting{log}"
        text = str(exc).strip()
        if "connection closed" in text.lower() or isinstance(exc, (EOFError, BrokenPipeError)):
            return f"it stopped before it answered{log}"
        if server.url:
            return f"{server.url} did not answer as an MCP server ({one_line(exc, 'connecting')})"
        return f"it failed: {one_line(exc, 'starting')}{log}"

    async def _call(self, session, tool: str, arguments: dict, timeout: float) -> ToolResult:
        from mcp import MCPError

        try:
            result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except MCPError as exc:
            if "timed out" in exc.message.lower():
                return results.timed_out(timeout)
            return results.failed(exc.message or "the server refused the call")
        except Exception as exc:  # noqa: BLE001 - a broken server or transport is a result, never a traceback
            return results.failed(one_line(_innermost(exc), "the call"))
        return results.from_mcp(result)


async def _session(stack: contextlib.AsyncExitStack, transport, on_message):
    """The ClientSession over `transport`, initialized within START_S; `on_message` gets what the transport could
    not read (an Exception) and the server's notifications."""
    import anyio
    from mcp import ClientSession

    _quiet_sdk_parse_errors()
    read, write = await stack.enter_async_context(transport)
    session = await stack.enter_async_context(ClientSession(read, write, message_handler=on_message))
    with anyio.fail_after(START_S):
        await session.initialize()
    return session


async def _listed_tools(session) -> tuple[ToolSpec, ...]:
    """Every tool the server lists (all pages), as ToolSpecs."""
    import anyio
    from mcp.types import PaginatedRequestParams

    tools: list[ToolSpec] = []
    cursor = None
    with anyio.fail_after(START_S):
        for _ in range(100):
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            for tool in page.tools:
                schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
                tools.append(ToolSpec(tool.name, tool.description or "", dict(schema)))
            cursor = page.next_cursor
            if not cursor:
                break
    return tuple(tools)


async def _log_bad_message(log, message) -> None:
    """A line of a stdio server's stdout that is not an MCP message (a server printing its own chatter): one line in
    its log (`log` None: an HTTP server's, said nowhere). Anything else the session surfaces is not ours to keep."""
    if log is None or not isinstance(message, Exception):
        return
    log.write(f"{time.strftime('%H:%M:%S')} not an MCP message on stdout, skipped: {_unreadable(message)}\n")
    log.flush()


def _unreadable(exc: Exception) -> str:
    """What the SDK could not read, in one line: pydantic's first error and the line it read, cut at 200 chars."""
    errors = getattr(exc, "errors", None)
    first = errors()[0] if callable(errors) and errors() else None
    text = f"{first.get('msg', '')}: {first.get('input')!r}" if isinstance(first, dict) else str(exc)
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:199] + "…"


class _DropParseErrors:
    """The SDK logs a traceback for every stdout line that is not an MCP message; each is said in the server's own
    log instead (`_log_bad_message`), never on the screen."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Failed to parse JSONRPC message")


_PARSE_ERRORS = _DropParseErrors()


def _quiet_sdk_parse_errors() -> None:
    import logging

    logger = logging.getLogger("mcp.client.stdio")
    if _PARSE_ERRORS not in logger.filters:
        logger.addFilter(_PARSE_ERRORS)


def _http_transport(url: str):
    from mcp.client.streamable_http import streamable_http_client

    return streamable_http_client(url)


def _innermost(exc: BaseException) -> BaseException:
    """The first real failure inside task groups' exception groups."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:  # type: ignore[attr-defined]
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc
