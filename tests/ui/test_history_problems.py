"""A history that cannot be written or opened: said once per chat, in words, and the chat goes on
(on the real engine with the tiny random pair)."""

from __future__ import annotations

import sqlite3

from dflash_chat import paths
from dflash_chat.chat.conversation import Message
from dflash_chat.chat.history import HistoryStore
from dflash_chat.runtime.model_source import ModelSource
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.history_screen import HistoryScreen

from .conftest import ask, fast_settings, loaded, run, wait_for


def make_app(tiny_pair, **kwargs):
    target, drafter = tiny_pair
    return DFlashChatApp(fast_settings(max_new_tokens=3), ModelSource(str(target), str(drafter)), **kwargs)


def history_notices(app) -> list[str]:
    return [n.message for n in app._notifications if "history" in n.message.lower()]


def make_read_only(path) -> None:
    """Read-only the way SQLite itself honours, even for root: a file format write version above 2."""
    with open(path, "r+b") as handle:
        handle.seek(18)
        handle.write(bytes([3]))


def seed(path) -> None:
    store = HistoryStore(path)
    store.add(store.create("older"), Message("user", "kept"))
    store.close()


def test_a_read_only_history_is_said_once_per_chat_and_the_chat_goes_on(home, tiny_pair):
    db = paths.history_db()
    seed(db)
    make_read_only(db)
    before = db.read_bytes()

    async def main():
        app = make_app(tiny_pair)
        async with app.run_test(size=(120, 36)) as pilot:
            await ask(pilot, app, "first", 1)
            await ask(pilot, app, "second", 2)
            first_chat = history_notices(app)
            await pilot.press("ctrl+n")
            await ask(pilot, app, "another chat", 1)
            return first_chat, history_notices(app)

    first_chat, both = run(main())
    assert len(first_chat) == 1 and len(both) == 2  # once per chat, however many writes it tried
    message = first_chat[0]
    assert "not being saved" in message and "read-only" in message and "--data-dir" in message
    assert not any("NOT NULL" in m or "constraint" in m for m in both)
    assert db.read_bytes() == before


def test_a_history_another_program_holds_is_said_so_and_the_chat_goes_on(home, tiny_pair):
    db = paths.history_db()
    seed(db)

    async def main():
        app = make_app(tiny_pair)
        async with app.run_test(size=(120, 36)) as pilot:
            await loaded(pilot, app)
            other = sqlite3.connect(db, isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")  # a database tool in the middle of a write
            try:
                await ask(pilot, app, "while it is held", 1)
                answer = app.chat.conversation.messages[-1].content
            finally:
                other.execute("ROLLBACK")
                other.close()
            await pilot.press("ctrl+n")
            await ask(pilot, app, "after it is let go", 1)
            return history_notices(app), answer

    notices, answer = run(main())
    assert answer and len(notices) == 1
    assert "another program holds the history file" in notices[0] and "read-only" not in notices[0]
    assert [s.title for s in HistoryStore(db).summaries()] == ["after it is let go", "older"]


def test_a_history_that_cannot_be_opened_keeps_the_session_in_memory(home, tiny_pair, tmp_path):
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data folder should be")

    async def main():
        app = make_app(tiny_pair, history_path=blocker / "history.sqlite3")
        async with app.run_test(size=(120, 36)) as pilot:
            await ask(pilot, app, "hello", 1)
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "history screen")
            rows = app.screen.query_one("#history-table").row_count
            return [(n.message, n.timeout) for n in app._notifications], rows

    notices, rows = run(main())
    off = [(m, t) for m, t in notices if m.startswith("Chat history is off")]
    assert off and off[0][1] >= 24 * 3600 and "cannot be opened or created" in off[0][0]
    assert rows == 1  # this session's chat, kept in memory
    assert blocker.read_text() == "a file where the data folder should be"
