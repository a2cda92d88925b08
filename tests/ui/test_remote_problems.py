"""The chat app on a remote engine that misbehaves (Pilot): a cut answer stays on screen and in the
history, marked cut with why; Ctrl+Q while the server stalls quits at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from dflash_chat import paths
from dflash_chat.chat.backends.remote import HttpBackend
from dflash_chat.chat.conversation import CUT
from dflash_chat.chat.history import HistoryStore
from dflash_chat.runtime.endpoint import Endpoint
from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from tests.chat.misbehaving import Misbehaving, Reply, chunk, chunked_head, delta, sse

from .conftest import send, wait_for

SETTINGS = Settings(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=16)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_dropped_stream_keeps_its_text_on_screen_and_in_the_history_marked_cut(home):
    with Misbehaving() as server:
        server.replies["/v1/chat/completions"] = Reply(chunked_head(), chunk(sse(delta("Kept"), delta(" words"))))

        async def main():
            app = DFlashChatApp(SETTINGS, backend=HttpBackend(Endpoint.of(server.url)))
            async with app.run_test(size=(120, 36)) as pilot:
                await wait_for(pilot, lambda: app.chat.backend.model is not None, 5, "the connection")
                await send(pilot, "hi")
                await wait_for(pilot, lambda: app.chat.last_end is not None and app.chat.turn is None, 5, "the end")
                await pilot.pause()
                widget = app.chat.chat_view.query("AssistantMessage").last()
                status = str(widget.query_one(".status").render())
                notices = [n.message for n in app._notifications]
                return app.chat.last_end, status, notices

        end, status, notices = asyncio.run(main())
    assert end.reason == "cut" and end.answer == "Kept words"
    assert status.startswith("(cut short: the connection to 127.0.0.1") and "lost after 2 tokens" in status
    assert any("lost after 2 tokens" in n for n in notices)
    saved = HistoryStore(paths.history_db()).load(1).messages[-1]
    assert saved.status == CUT and saved.content == "Kept words"
    assert saved.note.startswith("the connection to 127.0.0.1") and "lost after 2 tokens" in saved.note


def test_ctrl_q_while_models_stalls_quits_at_once(home):
    with Misbehaving() as server:
        server.replies["/v1/models"] = Reply(None)  # accepted, never answered

        async def main():
            app = DFlashChatApp(SETTINGS, backend=HttpBackend(Endpoint.of(server.url)))
            async with app.run_test(size=(120, 36)) as pilot:
                await wait_for(pilot, lambda: "/v1/models" in server.seen, 5, "the request")
                await pilot.press("ctrl+q")
            return app.return_code

        started = time.monotonic()
        asyncio.run(main())  # its end joins the app's worker threads: none may be waiting on the network
        took = time.monotonic() - started
    assert took < 3, f"quitting took {took:.1f} s"
