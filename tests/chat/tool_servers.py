"""The test MCP server (mcp_server.py) as the [mcp] settings name it, for the tests that start it."""

from __future__ import annotations

import sys
from pathlib import Path

from dflash_chat.mcp_config import McpServer, McpSettings

SERVER = Path(__file__).with_name("mcp_server.py")


def tool_server(calls: Path | None = None, **env: str) -> McpServer:
    """The test server, run by this Python; `calls`: the file it writes each call it gets to."""
    extra = {"MCP_TEST_CALLS": str(calls)} if calls is not None else {}
    return McpServer(command=sys.executable, args=(str(SERVER),), env={**extra, **env})


def mcp_settings(
    calls: Path | None = None, *, rounds: int = 8, timeout: float = 60.0, **others: McpServer
) -> McpSettings:
    """[mcp] with the test server as `test` (and `others`)."""
    return McpSettings({"test": tool_server(calls), **others}, rounds=rounds, timeout=timeout)


def calls_made(calls: Path) -> list[str]:
    """The calls the test server got, in order."""
    return calls.read_text().splitlines() if calls.exists() else []
