"""MCP with a remote engine (Pilot): the chat app, pointed at our own `serve` running the scripted pair
(tests/engine/scripted.py), sends the chat's tools in the request; serve renders them into the prompt,
parses the model's call and streams it back as `tool_calls`; the app asks, runs the call on the real MCP
server, sends the result back as a tool message, and the model answers from it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from dflash_chat.chat.backends.remote import HttpBackend
from dflash_chat.chat.conversation import COMPLETE
from dflash_chat.chat.tools.choice import ChatTools
from dflash_chat.runtime.endpoint import Endpoint
from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.confirm_call_screen import ConfirmCallScreen
from tests.chat.tool_servers import calls_made, mcp_settings
from tests.ui.conftest import wait_for

from .conftest import serving

SETTINGS = Settings(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=16)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_remote_engine_calls_the_chats_tools_and_answers_from_the_result(home, tool_pair, tmp_path):
    from dflash_chat.engine.load import load_pair

    pair = load_pair(*map(str, tool_pair), device="cpu", max_context=4096)
    calls = tmp_path / "calls.txt"
    with serving(pair) as (_, url):

        async def main():
            settings = replace(SETTINGS, mcp=mcp_settings(calls))
            app = DFlashChatApp(settings, backend=HttpBackend(Endpoint.of(f"{url}/v1")))
            async with app.run_test(size=(120, 36)) as pilot:
                await wait_for(pilot, lambda: app.chat.backend.model is not None, 30, "the connection")
                app.chat.conversation.tools = ChatTools(choice="test/echo")
                await pilot.press(*"hello", "enter")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCallScreen), 60, "the question")
                await pilot.press("y")
                await wait_for(pilot, lambda: not app.chat.generating, 60, "the loop to end")
                return [(m.role, m.content, m.status, len(m.tool_calls)) for m in app.chat.conversation.messages]

        rows = asyncio.run(main())
    assert rows == [
        ("user", "hello", COMPLETE, 0),
        ("assistant", "", COMPLETE, 1),
        ("tool", "echo: nothing", COMPLETE, 0),
        ("assistant", "Done.", COMPLETE, 0),
    ]
    assert calls_made(calls) == ["echo nothing"]
