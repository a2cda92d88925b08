"""A real MCP server for the tests, written with the `mcp` SDK and run over stdio as the app runs any server:
`python tests/chat/mcp_server.py` (or over streamable HTTP: `... --http PORT`, at /mcp). Its tools: one that
answers, one that fails, one that hangs, one that answers with too much text, and one that tells an
environment variable (what the app passes it).

Every call is also written to the file named by MCP_TEST_CALLS (when set), one line each, so a test can tell
which calls ran: a call the user declined never reaches this server. MCP_TEST_PID names a file it writes its
process id to, so a test can tell when it has gone. MCP_TEST_NOISE=N makes it print N lines on stdout that are
not MCP messages before it serves.
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("test-tools")


def record(line: str) -> None:
    path = os.environ.get("MCP_TEST_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


@server.tool()
def echo(text: str = "nothing") -> str:
    """Say the text back."""
    record(f"echo {text}")
    print(f"echo called with {text!r}", file=sys.stderr)  # goes to the app's log file, never the screen
    return f"echo: {text}"


@server.tool()
def fail(why: str = "no reason") -> str:
    """Always fails."""
    record(f"fail {why}")
    raise RuntimeError(f"failed on purpose: {why}")


@server.tool()
async def hang() -> str:
    """Never answers (until cancelled)."""
    record("hang")
    await anyio.sleep(3600)
    return "never"


@server.tool()
def flood(size: int = 100_000) -> str:
    """Answers with `size` characters."""
    record(f"flood {size}")
    return "x" * size


@server.tool()
def env(name: str) -> str:
    """The value of an environment variable, or <unset>."""
    record(f"env {name}")
    return os.environ.get(name, "<unset>")


if __name__ == "__main__":
    for n in range(int(os.environ.get("MCP_TEST_NOISE", "0"))):  # a server printing its own chatter on stdout
        print(f"chatter {n}: not an MCP message", flush=True)
    if os.environ.get("MCP_TEST_PID"):
        with open(os.environ["MCP_TEST_PID"], "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
