"""SVG snapshots at a fixed size, from a fixed history (no clocks, no model output).

Update after an intended change with: pytest tests/ui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest
from textual.widgets import Input, TextArea

from dflash_chat import paths
from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.history_screen import HistoryScreen
from dflash_chat.ui.settings_screen import SettingsScreen

from .conftest import answer_ended, seed_history, wait_for

SIZE = (120, 36)
THEMES = ["dflash-dark", "dflash-light"]


def steady(screen) -> None:
    """No blinking cursors: a snapshot must not depend on when it is taken."""
    for widget in screen.query(TextArea):
        widget.cursor_blink = False
    for widget in screen.query(Input):
        widget.cursor_blink = False


@pytest.mark.parametrize("theme", THEMES)
def test_chat_mid_conversation(snap_compare, home, theme):
    cid = seed_history(paths.history_db())
    app = DFlashChatApp(Settings(theme=theme))

    async def run_before(pilot):
        await wait_for(pilot, lambda: app.chat.is_mounted and app.chat.query("ChatView"), 30, "chat screen")
        await app.chat.open_conversation(cid)
        steady(app.screen)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("theme", THEMES)
def test_history_screen(snap_compare, home, theme):
    seed_history(paths.history_db())
    app = DFlashChatApp(Settings(theme=theme))

    async def run_before(pilot):
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "history screen")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("theme", THEMES)
def test_settings_screen(snap_compare, home, theme):
    app = DFlashChatApp(Settings(theme=theme, system_prompt="You are a helpful assistant."))

    async def run_before(pilot):
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
        steady(app.screen)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_chat_on_a_narrow_terminal_with_the_panel_below(snap_compare, home):
    cid = seed_history(paths.history_db())
    app = DFlashChatApp(Settings())

    async def run_before(pilot):
        await wait_for(pilot, lambda: app.chat.is_mounted and app.chat.query("ChatView"), 30, "chat screen")
        await app.chat.open_conversation(cid)
        await pilot.press("f2")
        steady(app.screen)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 30), run_before=run_before)


def test_chat_with_tool_calls(snap_compare, home):
    """An answer's calls as blocks: tool and state in the title, the arguments, then the result."""
    from dflash_chat.chat.conversation import DENIED, Message
    from dflash_chat.chat.history import HistoryStore
    from dflash_chat.runtime.tool_calls import ToolCall

    store = HistoryStore(paths.history_db(), clock=lambda: 1_767_225_600.0)
    cid = store.create("Notes about kettles")
    store.add(cid, Message("user", "What do my notes say about kettles?"))
    calls = (
        ToolCall("call_1", "search_notes", '{"query": "kettle", "limit": 3}'),
        ToolCall("call_2", "delete_note", '{"path": "notes/kettle.md"}'),
    )
    store.add(cid, Message("assistant", "Let me look through your notes.", tool_calls=calls))
    store.add(cid, Message("tool", "notes/kettle.md: descale it every month", tool_call_id="call_1"))
    store.add(
        cid, Message("tool", "The user declined this call; it was not run.", status=DENIED, tool_call_id="call_2")
    )
    store.add(cid, Message("assistant", "Your notes say to descale the kettle every month."))
    store.close()
    app = DFlashChatApp(Settings())

    async def run_before(pilot):
        await wait_for(pilot, lambda: app.chat.is_mounted and app.chat.query("ChatView"), 30, "chat screen")
        await app.chat.open_conversation(cid)
        for block in app.chat.query("ToolCallBlock"):
            block.collapsed = False
        steady(app.screen)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_tools_screen(snap_compare, home):
    """Servers that failed to start (and say why) and one turned off; the tools screen starts nothing else."""
    from dflash_chat.mcp_config import McpServer, McpSettings
    from dflash_chat.ui.tools_screen import ToolsScreen

    servers = {
        "notes": McpServer(command="no-such-mcp-server-here", args=("--root", "~/notes")),
        "everything": McpServer(command="npx", args=("-y", "@modelcontextprotocol/server-everything"), enabled=False),
    }
    app = DFlashChatApp(Settings(mcp=McpSettings(servers)))

    async def run_before(pilot):
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ToolsScreen), 30, "tools screen")
        await wait_for(pilot, lambda: app.chat.servers.states()["notes"].state == "failed", 30, "the failure")
        await pilot.pause()
        await app.screen.show_servers()
        steady(app.screen)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_the_question_before_a_call_runs(snap_compare, home):
    from dflash_chat.runtime.tool_calls import ToolCall
    from dflash_chat.ui.confirm_call_screen import ConfirmCallScreen

    app = DFlashChatApp(Settings())
    call = ToolCall("call_1", "delete_note", '{"path": "notes/kettle.md", "backup": true}')

    async def run_before(pilot):
        await wait_for(pilot, lambda: app.chat.is_mounted, 30, "chat screen")
        app.push_screen(ConfirmCallScreen(call, "notes", "delete_note"))
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCallScreen), 30, "the question")
        steady(app.screen)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 30), (120, 36)], ids=["80-columns", "120-columns"])
def test_the_panel_once_an_answer_ends(snap_compare, home, size):
    """Every row whole at both widths: under the chat in three columns at 80 (F2), beside it at 120."""
    app = DFlashChatApp(Settings())

    async def run_before(pilot):
        await wait_for(pilot, lambda: app.chat.is_mounted and app.chat.query("ChatView"), 30, "chat screen")
        if size[0] < 100:
            await pilot.press("f2")
        answer_ended(app.chat.panel)
        steady(app.screen)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 30), (120, 36)], ids=["80-columns", "120-columns"])
def test_images_as_chips_waiting_and_in_a_sent_message(snap_compare, home, tmp_path, size):
    """Two images waiting above the message box (a preview, the name and size, a ✕ each), and a sent message's
    image as a chip in the chat."""
    from PIL import Image

    from dflash_chat.chat.conversation import Message
    from dflash_chat.chat.history import HistoryStore
    from dflash_chat.chat.images import Attachment

    wide = Image.new("RGB", (40, 24), (220, 40, 40))
    wide.paste((250, 210, 40), (20, 0, 40, 24))  # red on the left, yellow on the right
    wide.save(tmp_path / "red and yellow.png")
    tall = Image.new("RGB", (16, 48), (40, 90, 220))
    tall.paste((40, 200, 90), (0, 24, 16, 48))  # blue above green
    tall.save(tmp_path / "tall.png")
    store = HistoryStore(paths.history_db(), clock=lambda: 1_767_225_600.0)
    cid = store.create("A chart")
    chart = Attachment("0123abcd" * 8, "sales chart.png", 1280, 720, 81_234, "PNG")
    store.add(cid, Message("user", "What does this chart show?", images=(chart,)))
    store.add(cid, Message("assistant", "Sales rise every month, fastest in March."))
    store.close()
    app = DFlashChatApp(Settings())

    async def run_before(pilot):
        await wait_for(pilot, lambda: app.chat.is_mounted and app.chat.query("ChatView"), 30, "chat screen")
        await app.chat.open_conversation(cid)
        box = app.chat.query_one(TextArea)
        box.insert(f'/image "{tmp_path / "red and yellow.png"}" "{tmp_path / "tall.png"}"')
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.chat.pending) == 2, 30, "the chips")
        steady(app.screen)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)
