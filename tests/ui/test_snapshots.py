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

from .conftest import seed_history, wait_for

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
