"""The MCP client (chat/tools/servers.py) against a real MCP server written with the SDK (mcp_server.py), over
stdio as the app starts any server, and over streamable HTTP: starting, listing, calling, every way a call
can go wrong as a result in words, what a server's process is given, and stopping without waiting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from dflash_chat.chat.conversation import CANCELLED, COMPLETE, ERROR, TIMEOUT
from dflash_chat.chat.tools import results
from dflash_chat.chat.tools.servers import DISABLED, FAILED, OFF, READY, ServerChanged, ToolServers
from dflash_chat.mcp_config import McpServer, McpSettings

from .tool_servers import SERVER, calls_made, tool_server

NEVER = threading.Event()  # a cancel flag nobody sets


def started(servers: ToolServers, *names: str) -> dict:
    servers.start(names)
    servers.wait(names, NEVER)
    return servers.states()


@pytest.fixture
def running(tmp_path):
    """The test server started (its calls written to calls.txt), stopped at the end."""
    calls = tmp_path / "calls.txt"
    servers = ToolServers(McpSettings({"t": tool_server(calls)}), tmp_path / "logs")
    seen: list[ServerChanged] = []
    servers.attach(seen.append)
    started(servers, "t")
    yield servers, calls, seen
    servers.close()


def test_a_server_starts_lists_its_tools_and_answers(running):
    servers, calls, seen = running
    state = servers.states()["t"]
    assert state.state == READY and [t.name for t in state.tools] == ["echo", "fail", "hang", "flood", "env"]
    echo = state.tools[0]
    assert echo.description == "Say the text back." and echo.parameters["properties"]["text"]["type"] == "string"
    assert [e.state.state for e in seen] == ["starting", "ready"]
    assert servers.call("t", "echo", {"text": "hi"}, 10, NEVER) == results.ToolResult(COMPLETE, "echo: hi")
    assert calls_made(calls) == ["echo hi"]


def test_every_way_a_call_fails_is_a_result_in_words(running):
    servers, calls, _ = running
    failed = servers.call("t", "fail", {"why": "disk on fire"}, 10, NEVER)
    assert failed.status == ERROR and failed.text.startswith("The tool reported an error:")
    unknown = servers.call("t", "nope", {}, 10, NEVER)
    assert unknown.status == ERROR and "nope" in unknown.text
    started_at = time.monotonic()
    hung = servers.call("t", "hang", {}, 1.5, NEVER)
    assert hung == results.timed_out(1.5) and hung.status == TIMEOUT and time.monotonic() - started_at < 10
    flood = servers.call("t", "flood", {"size": 50_000}, 10, NEVER)
    assert flood.status == COMPLETE and len(flood.text) < 16_200
    assert flood.text.endswith("[cut: the tool returned 50,000 characters; only the first 16,000 are here]")
    nowhere = servers.call("elsewhere", "echo", {}, 10, NEVER)
    assert nowhere.status == ERROR and "not running" in nowhere.text
    assert servers.call("t", "echo", {}, 10, NEVER).text == "echo: nothing"  # the server is fine after all that


def test_a_call_stops_at_once_when_its_cancel_flag_is_set(running):
    servers, calls, _ = running
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started_at = time.monotonic()
    result = servers.call("t", "hang", {}, 60, cancel)
    assert result == results.cut_off() and result.status == CANCELLED and time.monotonic() - started_at < 3
    assert calls_made(calls) == ["hang"]


def test_a_server_gets_its_own_env_path_and_home_and_never_the_users_secrets(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("DFLASH_TEST_SECRET", "hunter2")
    server = tool_server(None, API_TOKEN="for-this-server-only")
    servers = ToolServers(McpSettings({"t": server}), tmp_path / "logs")
    try:
        assert started(servers, "t")["t"].state == READY
        seen = {name: servers.call("t", "env", {"name": name}, 10, NEVER).text for name in ("API_TOKEN", "PATH")}
        seen["DFLASH_TEST_SECRET"] = servers.call("t", "env", {"name": "DFLASH_TEST_SECRET"}, 10, NEVER).text
        servers.call("t", "echo", {"text": "to the log"}, 10, NEVER)
    finally:
        servers.close()
    assert seen == {"API_TOKEN": "for-this-server-only", "PATH": os.environ["PATH"], "DFLASH_TEST_SECRET": "<unset>"}
    log = (tmp_path / "logs" / "mcp-t.log").read_text()
    assert "starting: " in log and "echo called with 'to the log'" in log  # its stderr: in its log
    assert "echo called" not in capfd.readouterr().err  # ... never on the terminal


def test_closing_returns_at_once_and_the_servers_process_ends(tmp_path):
    pid_file = tmp_path / "pid"
    servers = ToolServers(McpSettings({"t": tool_server(None, MCP_TEST_PID=str(pid_file))}), tmp_path / "logs")
    assert started(servers, "t")["t"].state == READY
    pid = int(pid_file.read_text())
    worker = threading.Thread(target=servers.call, args=("t", "hang", {}, 60, NEVER))
    worker.start()  # a call still running when the app quits
    time.sleep(0.3)
    started_at = time.monotonic()
    servers.close()
    assert time.monotonic() - started_at < 0.1
    worker.join(3)
    assert not worker.is_alive()  # the call's worker left at once
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def test_servers_that_cannot_start_say_why_and_what_to_do(tmp_path):
    quits = McpServer(command=sys.executable, args=("-c", "import sys; print('bad config', file=sys.stderr)"))
    settings = McpSettings(
        {
            "missing": McpServer(command="no-such-mcp-server-anywhere"),
            "quits": quits,
            "nobody": McpServer(url="http://127.0.0.1:9/mcp"),
            "off": McpServer(command="whatever", enabled=False),
        }
    )
    servers = ToolServers(settings, tmp_path / "logs")
    try:
        assert servers.enabled() == ["missing", "quits", "nobody"] and servers.states()["off"].state == DISABLED
        states = started(servers, "missing", "quits", "nobody", "off")
    finally:
        servers.close()
    assert {name: s.state for name, s in states.items()} == {
        "missing": FAILED,
        "quits": FAILED,
        "nobody": FAILED,
        "off": DISABLED,
    }
    assert states["missing"].error == (
        "the command 'no-such-mcp-server-anywhere' was not found on PATH: install it, or give its full path as "
        "[mcp.servers.missing] command"
    )
    log = tmp_path / "logs" / "mcp-quits.log"
    assert states["quits"].error == f"it stopped before it answered (its log: {log})"
    assert "bad config" in log.read_text()
    assert states["nobody"].error.startswith("http://127.0.0.1:9/mcp did not answer as an MCP server (")
    assert all("\n" not in s.error and "Traceback" not in s.error for s in states.values())


def test_a_failed_server_can_be_started_again(tmp_path):
    script = tmp_path / "later.py"
    script.write_text("import sys; sys.exit(1)\n")
    server = McpServer(command=sys.executable, args=(str(script),))
    servers = ToolServers(McpSettings({"later": server}), tmp_path / "logs")
    try:
        assert servers.states()["later"].state == OFF
        assert started(servers, "later")["later"].state == FAILED
        script.write_text(SERVER.read_text())  # fixed meanwhile
        assert started(servers, "later")["later"].state == READY
    finally:
        servers.close()


def test_a_server_over_streamable_http(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "MCP_TEST_CALLS": str(calls)}
    log = open(tmp_path / "http.log", "w")  # closed below
    process = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], env=env, stderr=log, stdout=log)
    servers = ToolServers(McpSettings({"web": McpServer(url=f"http://127.0.0.1:{port}/mcp")}), tmp_path / "logs")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        state = started(servers, "web")["web"]
        assert state.state == READY and len(state.tools) == 5 and state.log == ""
        assert servers.call("web", "echo", {"text": "over http"}, 10, NEVER).text == "echo: over http"
    finally:
        servers.close()
        process.terminate()
        process.wait(10)
        log.close()
    assert calls_made(calls) == ["echo over http"]


def test_content_blocks_become_text_the_model_can_read():
    import mcp.types as types

    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="first"),
            types.ImageContent(type="image", data="aGVsbG8h", mime_type="image/png"),
            types.EmbeddedResource(
                type="resource", resource=types.TextResourceContents(uri="file:///notes.txt", text="note text")
            ),
            types.ResourceLink(type="resource_link", name="n", uri="file:///big.bin"),
        ]
    )
    assert results.from_mcp(result) == results.ToolResult(
        COMPLETE, "first\n[image: image/png, about 6 bytes]\nnote text\n[resource: file:///big.bin]"
    )
    assert results.from_mcp(types.CallToolResult(content=[], structured_content={"n": 1})).text == '{\n "n": 1\n}'
    assert results.from_mcp(types.CallToolResult(content=[])).text == "(the tool returned nothing)"
    failed = results.from_mcp(types.CallToolResult(content=[], is_error=True))
    assert failed == results.ToolResult(ERROR, "The tool reported an error: it gave no reason")


def test_a_data_folder_that_cannot_hold_the_log_keeps_the_servers_output_off_the_screen(tmp_path, capfd):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the log folder would be")
    servers = ToolServers(McpSettings({"t": tool_server(None)}), blocked / "logs")
    try:
        assert started(servers, "t")["t"].state == READY
        assert servers.call("t", "echo", {"text": "unseen"}, 10, NEVER).text == "echo: unseen"
    finally:
        servers.close()
    assert "echo called" not in capfd.readouterr().err


def test_a_server_printing_chatter_on_stdout_says_it_in_its_log_not_on_the_screen(tmp_path, capfd, caplog):
    """Lines on a server's stdout that are not MCP messages: one line each in mcp-NAME.log, no traceback on the
    app's stderr (nor logged, where the app's stderr would show it), and the server still serves."""
    servers = ToolServers(McpSettings({"t": tool_server(None, MCP_TEST_NOISE="5")}), tmp_path / "logs")
    try:
        assert started(servers, "t")["t"].state == READY
        assert servers.call("t", "echo", {"text": "still here"}, 10, NEVER).text == "echo: still here"
    finally:
        servers.close()
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err and "chatter" not in printed.err + printed.out
    assert not [record for record in caplog.records if record.exc_info], caplog.text
    logged = (tmp_path / "logs" / "mcp-t.log").read_text().splitlines()
    bad = [line for line in logged if "not an MCP message on stdout" in line]
    assert len(bad) == 5 and all("chatter" in line for line in bad), logged
