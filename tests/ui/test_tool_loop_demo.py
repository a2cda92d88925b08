"""The agent loop with the shipped demo pair (Pilot), the way a user meets it: the model chooses to call a tool
by itself (no forced call), the user says yes, the result goes back, the model answers.

The demo target is being trained to call tools (on another branch). Until its greedy answer to PROMPT, with
the test server's tools offered, holds a call, these tests skip and say so; the loop's logic is covered
meanwhile by test_tool_loop.py, on the scripted pair.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dflash_chat.chat.conversation import COMPLETE
from dflash_chat.chat.tools.choice import ChatTools
from dflash_chat.chat.tools.servers import ToolServers
from dflash_chat.models.demo import demo_available
from dflash_chat.runtime.model_source import demo_source
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.confirm_call_screen import ConfirmCallScreen
from tests.chat.tool_servers import calls_made, mcp_settings

from .conftest import fast_settings, loaded, run, send, wait_for

PROMPT = "Use the echo tool to say hello."
CONTEXT = 4096


@pytest.fixture(scope="module")
def demo_calls(tmp_path_factory):
    """The demo target's greedy answer to PROMPT with the test server's tools, as the app would offer them:
    skips unless it calls one of them."""
    if not demo_available():
        pytest.skip("the demo pair is not in dflash_chat/demo_data")
    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_paths
    from dflash_chat.runtime.session import EngineSession

    servers = ToolServers(mcp_settings(), Path(tmp_path_factory.mktemp("logs")))
    try:
        servers.start(["test"])
        servers.wait(["test"], threading.Event())
        offered = ChatTools().offer(servers.tools(), first=True)
    finally:
        servers.close()
    assert offered is not None, "the test server did not start"
    session = EngineSession(load_pair(*demo_paths(), device="cpu", max_context=CONTEXT))
    prompt = session.chat_prompt([{"role": "user", "content": PROMPT}], False, None, offered.use)
    params = fast_settings(max_new_tokens=64).sampling()
    end = session.answer(prompt, params, threading.Event(), lambda chunk: None, tools=offered.use)
    calls = [call for call in end.tool_calls if offered.route(call.name) is not None]
    if not calls:
        pytest.skip(
            f"the demo target does not call tools yet: its greedy answer to {PROMPT!r} holds no call "
            f"({end.answer[:60]!r}...); the loop is tested on the scripted pair meanwhile"
        )
    return calls


def test_the_demo_calls_a_tool_on_its_own_and_answers_from_the_result(home, demo_calls, tmp_path):
    calls = tmp_path / "calls.txt"

    async def main():
        settings = fast_settings(max_new_tokens=64, context_length=CONTEXT, mcp=mcp_settings(calls))
        app = DFlashChatApp(settings, demo_source())
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot, app)
            await send(pilot, PROMPT)
            answers = 0
            while True:  # yes to the first call, no to any later one: the loop always ends
                await wait_for(
                    pilot,
                    lambda: isinstance(app.screen, ConfirmCallScreen) or not app.chat.generating,
                    120,
                    "a question or the end of the loop",
                )
                if not isinstance(app.screen, ConfirmCallScreen):
                    break
                await pilot.press("y" if answers == 0 else "n")
                answers += 1
                await pilot.pause()
            return app.chat.conversation.messages

    messages = run(main())
    first = next(m for m in messages if m.role == "tool")
    assert first.status == COMPLETE and calls_made(calls)[0].startswith(demo_calls[0].name)
    assert messages[-1].role in ("assistant", "tool")


def test_call_first_makes_the_demo_call_the_chosen_tool_and_the_user_is_asked(home, tmp_path):
    """F3's *Call first* on an MCP tool: held to the call's grammar, the demo (which never finishes a call on its
    own) calls it, the user is asked, and the result goes back; no call markup is left in the answer's text."""
    if not demo_available():
        pytest.skip("the demo pair is not in dflash_chat/demo_data")
    calls = tmp_path / "calls.txt"

    async def main():
        settings = fast_settings(max_new_tokens=48, context_length=CONTEXT, mcp=mcp_settings(calls))
        app = DFlashChatApp(settings, demo_source())
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot, app)
            app.chat.conversation.tools = ChatTools(choice="test/echo")
            await send(pilot, "Say hello through the echo tool.")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCallScreen), 180, "the question")
            asked = (app.screen.tool, app.screen.server, calls_made(calls))
            await pilot.press("y")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCallScreen) or not app.chat.generating, 180)
            while isinstance(app.screen, ConfirmCallScreen):  # a later call of the loop: no
                await pilot.press("n")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCallScreen) or not app.chat.generating, 180)
            return asked, app.chat.conversation.messages

    asked, messages = run(main())
    assert asked == ("echo", "test", [])
    tool = next(m for m in messages if m.role == "tool")
    assert tool.status == COMPLETE and calls_made(calls)[0].startswith("echo")
    first = next(m for m in messages if m.role == "assistant")
    assert first.tool_calls and first.tool_calls[0].name == "echo"
    assert all("<tool_call>" not in (m.content or "") for m in messages if m.role == "assistant")
