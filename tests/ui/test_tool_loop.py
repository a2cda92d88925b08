"""The agent loop through the chat screen (Pilot), on the REAL engine with a real MCP server over stdio.

The model is tests/engine/scripted.py's: its greedy answers are set by hand, so it closes a forced call (the
chat's "call first" choice names the tool) and then answers `Done.`; the `calling_pair` calls `echo` in every
answer. The server is tests/chat/mcp_server.py, started by the app as any server is; it writes each call it
gets to a file, so a test knows which calls really ran.
"""

from __future__ import annotations

import time

from dflash_chat import paths
from dflash_chat.chat.conversation import CANCELLED, COMPLETE, DENIED, ERROR, SKIPPED, TIMEOUT
from dflash_chat.chat.history import HistoryStore
from dflash_chat.chat.tools.choice import ChatTools
from dflash_chat.runtime.model_source import ModelSource
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.confirm_call_screen import ConfirmCallScreen
from dflash_chat.ui.widgets.tool_call_block import ToolCallBlock
from tests.chat.tool_servers import calls_made, mcp_settings

from .conftest import fast_settings, loaded, run, send, wait_for


def make_app(pair, calls, **mcp):
    target, drafter = pair
    settings = fast_settings(max_new_tokens=16, context_length=4096, mcp=mcp_settings(calls, **mcp))
    return DFlashChatApp(settings, ModelSource(str(target), str(drafter)))


def roles(app) -> list[tuple[str, str, str]]:
    """The open chat as (role, text, status) rows; an answer's calls as call:NAME."""
    rows = []
    for m in app.chat.conversation.messages:
        text = m.content if not m.tool_calls else " ".join(f"call:{c.name}" for c in m.tool_calls)
        rows.append((m.role, text, m.status))
    return rows


async def asked(pilot, app) -> ConfirmCallScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCallScreen), 60, "the question before the call")
    return app.screen


async def settled(pilot, app, what: str = "the loop to end") -> None:
    await wait_for(pilot, lambda: not app.chat.generating, 60, what)
    await pilot.pause()


async def message(pilot, app, text: str, tool: str | None = None) -> None:
    """Once the model is loaded: make the first answer call `tool` (the chat's choice), and send `text`."""
    await loaded(pilot, app)
    if tool is not None:
        app.chat.conversation.tools = ChatTools(choice=f"test/{tool}")
    await send(pilot, text)


def block_titles(app) -> list[str]:
    return [str(block.title) for block in app.chat.query(ToolCallBlock)]


def test_a_confirmed_call_runs_its_result_goes_back_and_the_model_answers_again(home, tool_pair, tmp_path):
    calls = tmp_path / "calls.txt"

    async def main():
        app = make_app(tool_pair, calls)
        async with app.run_test(size=(120, 40)) as pilot:
            await message(pilot, app, "say hello", tool="echo")
            question = await asked(pilot, app)
            shown = (question.tool, question.server, calls_made(calls))
            await pilot.press("y")
            await settled(pilot, app)
            first = roles(app), block_titles(app), calls_made(calls), app.chat.last_prompt.text
            cid = app.chat.conversation.id
            await pilot.press("ctrl+n")
            await app.chat.open_conversation(cid)  # from the history: the block and its result come back
            await pilot.pause()
            return (
                shown,
                first,
                block_titles(app),
                [b.query_one(".tool-result").render() for b in app.chat.query(ToolCallBlock)],
            )

    shown, (rows, titles, ran, last_prompt), reopened, results = run(main())
    assert shown == ("echo", "test", [])  # asked before anything reached the server
    assert rows == [
        ("user", "say hello", COMPLETE),
        ("assistant", "call:echo", COMPLETE),
        ("tool", "echo: nothing", COMPLETE),
        ("assistant", "Done.", COMPLETE),
    ]
    assert ran == ["echo nothing"] and titles == ["⚙ echo · done"]
    assert "<tool_response>\necho: nothing\n</tool_response>" in last_prompt  # the result went back to the model
    assert reopened == ["⚙ echo · done"] and "echo: nothing" in str(results[0])
    saved = HistoryStore(paths.history_db()).load(1)
    assert [(m.role, m.status) for m in saved.messages] == [(r[0], r[2]) for r in rows]
    call = saved.messages[1].tool_calls[0]
    assert call.name == "echo" and saved.messages[2].tool_call_id == call.id
    assert saved.tools.choice == "test/echo"


def one_call(pair, calls, tool: str, key: str, **mcp):
    """A message whose first answer calls `tool`, and `key` pressed at the question: the chat's rows, the
    calls' block titles and the last prompt the model got, once the loop has ended."""

    async def main():
        app = make_app(pair, calls, **mcp)
        async with app.run_test(size=(120, 40)) as pilot:
            await message(pilot, app, "please", tool=tool)
            await asked(pilot, app)
            await pilot.press(key)
            await settled(pilot, app)
            await pilot.pause(0.3)  # nothing more comes
            return roles(app), block_titles(app), app.chat.last_prompt.text

    return run(main())


def test_a_declined_call_never_reaches_the_server_and_the_model_hears_no(home, tool_pair, tmp_path):
    calls = tmp_path / "calls.txt"
    rows, titles, last_prompt = one_call(tool_pair, calls, "fail", "n")
    assert rows[2] == ("tool", "The user declined this call; it was not run.", DENIED)
    assert rows[3] == ("assistant", "Done.", COMPLETE) and len(rows) == 4
    assert titles == ["⚙ fail · declined"] and calls_made(calls) == []
    assert "The user declined this call" in last_prompt


def test_always_runs_that_tool_without_asking_again_in_this_chat_and_is_saved_with_it(home, tool_pair, tmp_path):
    calls = tmp_path / "calls.txt"

    async def main():
        app = make_app(tool_pair, calls)
        async with app.run_test(size=(120, 40)) as pilot:
            await message(pilot, app, "one", tool="echo")
            await asked(pilot, app)
            await pilot.press("a")
            await settled(pilot, app)
            await send(pilot, "two")  # the same tool again: it runs without a question (one would block the loop)
            await wait_for(pilot, lambda: len(calls_made(calls)) == 2, 60, "the second call")
            await settled(pilot, app)
            always = app.chat.conversation.tools.always
            await pilot.press("ctrl+n")  # a new chat asks again
            await message(pilot, app, "three", tool="echo")
            await asked(pilot, app)
            await pilot.press("n")
            await settled(pilot, app)
            return always, [r for r in roles(app) if r[0] == "tool"]

    always, new_chat = run(main())
    assert always == {"test/echo"} and calls_made(calls) == ["echo nothing", "echo nothing"]
    assert HistoryStore(paths.history_db()).load(1).tools.always == {"test/echo"}
    assert new_chat == [("tool", "The user declined this call; it was not run.", DENIED)]


def test_esc_at_the_question_stops_the_loop_and_the_call_never_runs(home, tool_pair, tmp_path):
    calls = tmp_path / "calls.txt"
    rows, titles, _ = one_call(tool_pair, calls, "echo", "escape")
    assert [r[0] for r in rows] == ["user", "assistant", "tool"]  # no answer after the stop
    assert rows[2][2] == CANCELLED and "stopped" in rows[2][1]
    assert titles == ["⚙ echo · stopped"] and calls_made(calls) == []
    saved = HistoryStore(paths.history_db()).load(1).messages
    assert [(m.role, m.status) for m in saved] == [("user", COMPLETE), ("assistant", COMPLETE), ("tool", CANCELLED)]


def test_esc_while_a_call_runs_stops_it_at_once_and_quitting_does_not_wait_on_the_server(home, tool_pair, tmp_path):
    calls = tmp_path / "calls.txt"

    async def main():
        app = make_app(tool_pair, calls)
        async with app.run_test(size=(120, 40)) as pilot:
            await message(pilot, app, "wait forever", tool="hang")
            await asked(pilot, app)
            await pilot.press("y")
            await wait_for(pilot, lambda: calls_made(calls) == ["hang"], 60, "the call to reach the server")
            started = time.monotonic()
            await pilot.press("escape")
            await settled(pilot, app, "the stop")
            stopped_in = time.monotonic() - started
            rows = roles(app)
            await send(pilot, "again")  # hangs again: this time the app quits while it runs
            await asked(pilot, app)
            await pilot.press("y")
            await wait_for(pilot, lambda: len(calls_made(calls)) == 2, 60, "the second call")
            quit_at = time.monotonic()
        return rows, stopped_in, time.monotonic() - quit_at

    rows, stopped_in, quit_in = run(main())
    assert rows[2] == ("tool", "Stopped: the user stopped the answer while this call ran; it has no result.", CANCELLED)
    assert len(rows) == 3 and stopped_in < 5 and quit_in < 5
    saved = HistoryStore(paths.history_db()).load(1).messages
    assert saved[-1].role == "tool" and saved[-1].status == CANCELLED  # the second call, cut by quitting, is kept


def test_a_failing_tool_becomes_a_result_and_the_model_carries_on(home, tool_pair, tmp_path):
    calls = tmp_path / "calls.txt"
    rows, titles, _ = one_call(tool_pair, calls, "fail", "y")
    assert rows[2][0] == "tool" and rows[2][2] == ERROR and rows[2][1].startswith("The tool reported an error: ")
    assert "Traceback" not in rows[2][1] and rows[3] == ("assistant", "Done.", COMPLETE)
    assert titles == ["⚙ fail · failed"] and calls_made(calls) == ["fail no reason"]


def test_a_hanging_tool_times_out_into_a_result_and_the_model_carries_on(home, tool_pair, tmp_path):
    calls = tmp_path / "calls.txt"
    rows, titles, _ = one_call(tool_pair, calls, "hang", "y", timeout=2)
    assert rows[2] == ("tool", "The tool did not answer within 2 s (the mcp.timeout setting); it was stopped.", TIMEOUT)
    assert rows[3] == ("assistant", "Done.", COMPLETE) and titles == ["⚙ hang · timed out"]


def test_a_model_that_keeps_calling_stops_at_the_round_limit(home, calling_pair, tmp_path):
    calls = tmp_path / "calls.txt"

    async def main():
        app = make_app(calling_pair, calls, rounds=2)
        notes = []
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await loaded(pilot, app)
            app.chat.conversation.tools = ChatTools(always=frozenset({"test/echo"}))  # no questions: it just loops
            await send(pilot, "loop")
            await settled(pilot, app)
            notes = [n.message for n in app._notifications]
            return roles(app), notes

    rows, notes = run(main())
    assert [r[0] for r in rows] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert [r[2] for r in rows if r[0] == "tool"] == [COMPLETE, COMPLETE, SKIPPED]
    assert "limit of 2 rounds" in rows[-1][1] and calls_made(calls) == ["echo nothing"] * 2
    assert any("used its 2 rounds of tool calls" in n for n in notes)


def test_the_tools_screen_lists_the_servers_and_each_chat_saves_which_tools_it_offers(home, tool_pair, tmp_path):
    from textual.widgets import Select

    from dflash_chat.mcp_config import McpServer
    from dflash_chat.ui.tools_screen import ToolCheckbox, ToolsScreen

    calls = tmp_path / "calls.txt"
    missing = McpServer(command="no-such-mcp-server-here")
    off = McpServer(command="whatever", enabled=False)

    async def main():
        app = make_app(tool_pair, calls, missing=missing, off=off)
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot, app)
            await pilot.press("f3")
            await wait_for(pilot, lambda: isinstance(app.screen, ToolsScreen), 30, "the tools screen")
            screen = app.screen
            await wait_for(pilot, lambda: len(screen.query(ToolCheckbox)) == 5, 60, "the test server's tools")
            await wait_for(pilot, lambda: "failed" in str(screen.query_one("#server-missing").children[0].render()), 30)
            headers = {s.id: str(s.children[0].render()) for s in screen.query(".tool-server")}
            errors = [str(e.render()) for e in screen.query(".tool-error")]
            flood = next(b for b in screen.query(ToolCheckbox) if b.tool_key == "test/flood")
            flood.value = False  # unticked: this chat no longer offers it
            await pilot.pause()
            screen.query_one("#tools-choice", Select).value = "test/echo"
            await pilot.pause()
            await pilot.press("escape")
            await send(pilot, "hi")
            await asked(pilot, app)
            await pilot.press("y")
            await settled(pilot, app)
            return headers, errors, app.chat.conversation.tools, app.chat.last_prompt.text

    headers, errors, tools, prompt = run(main())
    assert "ready · 5 tools" in headers["server-test"] and "disabled" in headers["server-off"]
    assert errors == [
        "the command 'no-such-mcp-server-here' was not found on PATH: install it, or give its full path as "
        "[mcp.servers.missing] command"
    ]
    assert tools.offered == {"test/echo", "test/fail", "test/hang", "test/env"} and tools.choice == "test/echo"
    assert '"name": "echo"' in prompt and '"name": "flood"' not in prompt  # what the model was offered
    assert HistoryStore(paths.history_db()).load(1).tools == tools
    assert calls_made(calls) == ["echo nothing"]


def test_a_chat_without_tool_servers_answers_as_before(home, tool_pair, tmp_path):
    """No [mcp] servers: no tools in the prompt, no loop, nothing started."""

    async def main():
        target, drafter = tool_pair
        app = DFlashChatApp(fast_settings(max_new_tokens=16), ModelSource(str(target), str(drafter)))
        async with app.run_test(size=(120, 40)) as pilot:
            await message(pilot, app, "hello")
            await settled(pilot, app)
            return roles(app), app.chat.last_prompt.text, app.chat.servers.states()

    rows, prompt, states = run(main())
    assert rows == [("user", "hello", COMPLETE), ("assistant", "Done.", COMPLETE)]
    assert "<tools>" not in prompt and states == {}
