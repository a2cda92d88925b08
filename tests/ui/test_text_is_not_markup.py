"""Text the app does not control (chat titles, typed values, paths, error messages) is shown as it is:
read as Textual markup, '[/x]' fails at paint time and '[@click=app.quit]' runs an action."""

from __future__ import annotations

from textual.widgets import DataTable, Input, Static

from dflash_chat import paths
from dflash_chat.chat.conversation import Message
from dflash_chat.chat.history import HistoryStore
from dflash_chat.runtime.model_source import ModelSource
from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.dialogs import ConfirmDialog
from dflash_chat.ui.history_screen import HistoryScreen
from dflash_chat.ui.settings_screen import SettingsScreen
from dflash_chat.ui.widgets.chat_view import AssistantMessage, Notice

from .conftest import run, wait_for

TITLE = "[/x] why [@click=app.quit]"


def test_a_chat_title_and_error_text_that_look_like_markup_are_shown_as_they_are(home):
    store = HistoryStore(paths.history_db())
    cid = store.create(TITLE)
    store.add(cid, Message("user", "[/x] question"))
    store.add(cid, Message("assistant", "half", status="error"))
    store.close()

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "history screen")
            await pilot.pause()
            cell = str(app.screen.query_one(DataTable).get_cell_at((0, 0)))
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), 30, "confirm dialog")
            question = str(app.screen.query_one(".dialog-title").render())
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "back to history")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.screen is app.chat and app.chat.conversation.id == cid, 30, "the chat")
            await pilot.pause()
            return cell, question, app.is_running

    cell, question, running = run(main())
    assert cell == TITLE and TITLE in question and running


def test_a_typed_value_and_a_model_path_that_look_like_markup_are_shown_as_they_are(home, tmp_path):
    missing = tmp_path / "[" / "x]" / "model"

    async def main():
        app = DFlashChatApp(Settings(), ModelSource(str(missing), None))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: "did not load" in app.chat.notice(), 30, "the load to fail")
            await pilot.pause()
            notice = str(app.chat.query_one(Notice).render())
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            app.screen.query_one("#field-temperature", Input).value = "[/x]"
            await pilot.press("ctrl+s")
            await pilot.pause()
            errors = str(app.screen.query_one("#settings-errors", Static).render())
            return notice, errors

    notice, errors = run(main())
    assert "[/x]" in notice and "did not load" in notice
    assert errors == "Not saved: temperature must be a number from 0 to 2 (0 = greedy), got '[/x]'"


def test_an_error_status_under_an_answer_is_plain_text(home):
    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            widget = AssistantMessage(Message("assistant", "x", status="error"))
            await app.chat.chat_view.mount(widget)
            widget.show_status(widget._initial, "[/x] bad [b]bold")
            await pilot.pause()
            return str(widget.query_one(".status").render())

    assert run(main()) == "(failed: [/x] bad [b]bold)"
