"""The app without a model: input, history, settings, themes, keymap, palette, layout, errors."""

from __future__ import annotations

import sqlite3
import sys

from textual.widgets import DataTable, Input, Label, Switch

from dflash_chat import paths
from dflash_chat import settings as settings_module
from dflash_chat.chat.history import HistoryStore
from dflash_chat.runtime.model_source import ModelSource
from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.chat_screen import last_code_block
from dflash_chat.ui.history_screen import HistoryScreen
from dflash_chat.ui.keymap import COMMANDS
from dflash_chat.ui.settings_screen import SettingsScreen
from dflash_chat.ui.widgets.chat_view import AssistantMessage, Notice, UserMessage
from dflash_chat.ui.widgets.prompt_input import PromptInput

from .conftest import ANSWER, run, screen_lines, seed_history, wait_for

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


def test_enter_sends_and_ctrl_j_adds_a_line(home):
    seen = []

    def hook(message):  # sees each message once per node it bubbles through
        if isinstance(message, PromptInput.Submitted) and not any(m is message for m in seen):
            seen.append(message)

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            prompt = app.chat.query_one(PromptInput)
            await pilot.press("a", "ctrl+j", "b")
            typed = prompt.text
            await pilot.press("enter")
            await pilot.pause()
            return typed, prompt.text

    typed, after = run(main())
    assert typed == "a\nb"
    assert [m.text for m in seen] == ["a\nb"]
    assert after == "a\nb"  # without a model nothing is sent, so the text stays


def test_without_a_model_sending_keeps_the_text_and_says_why(home):
    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press(*"hello", "enter")
            await pilot.pause()
            return app.chat.query_one(PromptInput).text, notes(app), len(app.chat.query(Notice))

    text, messages, notices = run(main())
    assert text == "hello"
    assert any("No model is loaded yet" in m and "--target DIR" in m for m in messages)
    assert notices == 1


def test_up_and_down_walk_through_earlier_prompts(home):
    seed_history(paths.history_db())

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            prompt = app.chat.query_one(PromptInput)
            await pilot.press(*"draft")
            await pilot.press("up")
            first = prompt.text
            await pilot.press("up")
            second = prompt.text
            await pilot.press("down", "down")
            return first, second, prompt.text

    assert run(main()) == (
        "What does the `with` statement do in Python?",
        "How do I sort a dict by value?",
        "draft",
    )


def test_history_open_rename_delete_export(home, tmp_path):
    cid = seed_history(paths.history_db())
    export_dir = tmp_path / "exports"

    async def main():
        app = DFlashChatApp(Settings(), export_dir=export_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "history screen")
            table = app.screen.query_one(DataTable)
            assert table.row_count == 2
            # rename the newest (first row)
            await pilot.press("r")
            await wait_for(pilot, lambda: app.screen.query("#dialog-input"), 30, "rename dialog")
            app.screen.query_one(Input).value = "Context managers"
            await pilot.press("enter")
            await pilot.pause()
            # export it
            await pilot.press("e")
            await wait_for(pilot, lambda: app.screen.query("#dialog-input"), 30, "export dialog")
            exported = app.screen.query_one(Input).value
            await pilot.press("enter")
            await pilot.pause()
            # delete the older one (second row), then open the renamed one
            await pilot.press("down", "d")
            await wait_for(pilot, lambda: app.screen.query("#yes"), 30, "confirm dialog")
            await pilot.press("y")
            await pilot.pause()
            assert app.screen.query_one(DataTable).row_count == 1
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to chat")
            await pilot.pause()
            users = [w.text for w in app.chat.query(UserMessage)]
            answers = app.chat.query(AssistantMessage)
            return exported, users, len(answers), app.chat.conversation, app.chat.panel.shown

    exported, users, answers, conversation, shown = run(main())
    assert exported == str(export_dir / "context-managers.md")
    text = (export_dir / "context-managers.md").read_text()
    assert text.startswith("# Context managers") and 'with open("notes.txt")' in text
    assert users == ["What does the `with` statement do in Python?"] and answers == 1
    assert conversation.id == cid and conversation.title == "Context managers"
    assert shown["acceptance"] == "26.7 %" and shown["tokens/step"] == "5.00"  # from the saved stats
    assert shown["prompt"] == "42 (17 reused)"
    assert [s.title for s in HistoryStore(paths.history_db()).summaries()] == ["Context managers"]


def test_history_search_finds_chats_by_title_and_by_message_text_as_you_type(home):
    seed_history(paths.history_db())

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "history screen")
            screen = app.screen
            table = screen.query_one(DataTable)

            def titles() -> list[str]:
                return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]

            async def search(text: str) -> list[str]:
                field = screen.query_one("#history-search", Input)
                field.value = ""
                await pilot.press(*text)
                await pilot.pause()
                return titles()

            seen = {"all": titles()}
            await pilot.press("slash")  # / moves to the search field
            seen["context"] = await search("context")  # in the answer's text only
            seen["dict value"] = await search("dict value")  # typed letters never act as keys (d deletes)
            seen["nothing"] = await search("zzz")
            empty = str(screen.query_one("#history-empty", Label).render())
            lines = [line for line in screen_lines(app) if line.strip()]
            seen["sort"] = await search("sort")
            await pilot.press("enter")  # to the list
            await pilot.press("enter")  # open the one found
            await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to chat")
            return seen, empty, lines, app.chat.conversation.title

    seen, empty, lines, opened = run(main())
    assert seen == {
        "all": ["What does with do?", "Sorting a dict by value"],
        "context": ["What does with do?"],
        "dict value": ["Sorting a dict by value"],
        "nothing": [],
        "sort": ["Sorting a dict by value"],
    }
    assert empty == "No saved conversation holds every word of that search."
    # said where the list was, right under the search field, not past an empty table's screenful
    field = next(i for i, line in enumerate(lines) if "zzz" in line)
    said = next(i for i, line in enumerate(lines) if empty in line)
    assert 0 < said - field <= 2 and not any("Messages" in line for line in lines)
    assert opened == "Sorting a dict by value"
    assert len(HistoryStore(paths.history_db()).summaries()) == 2  # nothing was deleted on the way


def test_copy_last_answer_and_last_code_block(home):
    cid = seed_history(paths.history_db())

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            await app.chat.open_conversation(cid)
            await pilot.press("ctrl+l")
            answer = app.clipboard
            await pilot.press("ctrl+b")
            return answer, app.clipboard

    answer, code = run(main())
    assert answer == ANSWER
    assert code == 'with open("notes.txt") as handle:\n    text = handle.read()\n'
    assert last_code_block("no code here") is None


def test_settings_screen_refuses_bad_values_and_saves_good_ones(home):
    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            app.screen.query_one("#field-temperature", Input).value = "hot"
            await pilot.press("ctrl+s")
            await pilot.pause()
            still_open = isinstance(app.screen, SettingsScreen)
            refused = list(notes(app))
            app.screen.query_one("#field-temperature", Input).value = "0.3"
            app.screen.query_one("#field-system_prompt", Input).value = "Be brief."
            app.screen.query_one("#field-thinking", Switch).value = True
            app.screen.query_one("#field-theme").value = "dflash-light"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to chat")
            return still_open, refused, app.theme, app.chat.settings, app.chat.thinking

    still_open, refused, theme, chat_settings, thinking = run(main())
    assert still_open
    assert any("temperature must be a number" in m for m in refused)
    assert theme == "dflash-light" and thinking is True
    assert chat_settings.temperature == 0.3 and chat_settings.system_prompt == "Be brief."
    saved = settings_module.load()
    assert (saved.temperature, saved.system_prompt, saved.thinking, saved.theme) == (
        0.3,
        "Be brief.",
        True,
        "dflash-light",
    )


def test_settings_screen_edits_named_endpoints_and_the_decode_path(home):
    settings_module.update({"endpoints": {"lab": "http://lab:8000/v1"}})

    async def main():
        app = DFlashChatApp(settings_module.load())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            field = app.screen.query_one("#field-endpoints", Input)
            shown = field.value
            field.value = shown + ";big-box=ftp://x"
            await pilot.press("ctrl+s")
            await pilot.pause()
            refused = list(notes(app))
            field.value = shown + ";big-box=http://10.0.0.5:8000/v1"
            app.screen.query_one("#field-decode").value = "fixed"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to chat")
            return shown, refused, app.chat.settings

    shown, refused, chat_settings = run(main())
    assert shown == "lab=http://lab:8000/v1"
    assert any("big-box must be an http:// or https:// URL" in m for m in refused)
    saved = settings_module.load()
    assert (
        saved.endpoints
        == chat_settings.endpoints
        == {"lab": "http://lab:8000/v1", "big-box": "http://10.0.0.5:8000/v1"}
    )
    assert saved.decode == chat_settings.decode == "fixed"
    assert "[endpoints]" in paths.config_file().read_text()  # a TOML table, as a user would write it


def test_settings_screen_saves_model_paths_absolute(home, tmp_path, monkeypatch):
    """A path typed relative to where the app runs still names the same files from anywhere else."""
    monkeypatch.chdir(tmp_path)

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            app.screen.query_one("#field-model", Input).value = "./models/target"
            app.screen.query_one("#field-drafter", Input).value = "models/drafter"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to chat")
            return app.chat.settings

    chat_settings = run(main())
    saved = settings_module.load()
    expected = (str(tmp_path / "models" / "target"), str(tmp_path / "models" / "drafter"))
    assert (saved.model, saved.drafter) == expected
    assert (chat_settings.model, chat_settings.drafter) == expected


def test_theme_choice_persists_and_keeps_other_tables(home):
    config = paths.config_file()
    config.parent.mkdir(parents=True)
    config.write_text('[models.mine]\ntarget = "/x"\n')

    async def main():
        app = DFlashChatApp(settings_module.load())
        async with app.run_test(size=(120, 36)) as pilot:
            assert app.theme == "dflash-dark"
            app.theme = "dflash-high-contrast"
            await pilot.pause()

    run(main())
    document = tomllib.loads(config.read_text())
    assert document["theme"] == "dflash-high-contrast"
    assert document["models"] == {"mine": {"target": "/x"}}


def test_a_theme_that_cannot_be_saved_says_why(home):
    async def main():
        app = DFlashChatApp(settings_module.load())
        async with app.run_test(size=(120, 36)) as pilot:
            config = paths.config_file()
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text("theme = \n")  # broken by hand while the app runs
            app.theme = "dflash-light"
            await pilot.pause()
            return notes(app), config.read_text()

    messages, text = run(main())
    assert any(m.startswith("Could not save the theme choice") and "not valid TOML" in m for m in messages)
    assert text == "theme = \n"  # left for the user to fix


def test_shipped_and_user_themes_are_registered_and_broken_ones_reported(home):
    themes = paths.user_themes_dir()
    themes.mkdir(parents=True)
    (themes / "mine.toml").write_text('name = "my-theme"\nprimary = "#ff00ff"\ndark = false\n')
    (themes / "broken.toml").write_text('name = "oops"\nprimary = "not a colour"\n')

    async def main():
        app = DFlashChatApp(Settings(theme="my-theme"))
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            return app.theme, set(app.available_themes), notes(app)

    theme, available, messages = run(main())
    assert theme == "my-theme"
    assert {"dflash-dark", "dflash-light", "dflash-high-contrast", "my-theme"} <= available
    assert any("broken.toml" in m and "not a colour" in m for m in messages)


def test_keymap_from_settings_rebinds_by_id(home):
    async def main():
        app = DFlashChatApp(Settings(keymap={"toggle-thinking": "f5", "no-such-id": "f6"}))
        async with app.run_test(size=(120, 36)) as pilot:
            before = app.chat.thinking
            await pilot.press("f5")
            after_f5 = app.chat.thinking
            await pilot.press("ctrl+t")  # the old key no longer toggles
            return before, after_f5, app.chat.thinking, app.chat.panel.query_one(Switch).value, notes(app)

    before, after_f5, after_ctrl_t, switch, messages = run(main())
    assert (before, after_f5, after_ctrl_t, switch) == (False, True, True, True)
    assert any("unknown binding id 'no-such-id'" in m for m in messages)


def test_every_command_is_in_the_palette_with_its_key(home):
    async def main():
        app = DFlashChatApp(Settings(keymap={"regenerate": "f9"}))
        async with app.run_test(size=(120, 36)):
            return {c.title: c.help for c in app.get_system_commands(app.chat)}

    commands = run(main())
    for command in COMMANDS:
        assert command.title in commands
    assert commands["Regenerate"].endswith("(f9)")
    assert commands["Toggle thinking"].endswith("(ctrl+t)")
    assert "Quit" in commands and "Theme" in commands


def test_palette_command_runs_its_action(home):
    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            command = next(c for c in app.get_system_commands(app.chat) if c.title == "Toggle thinking")
            app.call_later(command.callback)
            await pilot.pause()
            await pilot.pause()
            return app.chat.thinking

    assert run(main()) is True


def test_narrow_terminal_hides_the_panel_until_asked(home):
    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(80, 30)) as pilot:
            await pilot.pause()
            hidden = not app.chat.panel.display or app.chat.panel.has_class("hidden")
            await pilot.press("f2")
            await pilot.pause()
            shown = app.chat.panel.has_class("hidden") is False
            panel_below = app.chat.panel.region.y > app.chat.query_one("#chat").region.y
            return hidden, shown, panel_below

    assert run(main()) == (True, True, True)


def test_a_missing_model_is_a_notification_and_the_app_stays_usable(home, tmp_path):
    async def main():
        app = DFlashChatApp(Settings(), ModelSource(str(tmp_path / "no-such-model"), None))
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: any("did not load" in m for m in notes(app)), 30, "load failure")
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "history screen")
            return notes(app), app.chat.sub_title

    messages, subtitle = run(main())
    failure = next(m for m in messages if "did not load" in m)
    assert "no-such-model" in failure and "Traceback" not in failure
    assert subtitle == "no model"


def test_a_corrupt_history_db_is_moved_aside(home):
    db = paths.history_db()
    db.parent.mkdir(parents=True)
    db.write_bytes(b"garbage" * 1000)

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            return notes(app), app.store.summaries()

    messages, summaries = run(main())
    assert any("cannot be read" in m and "new history was started" in m for m in messages)
    assert summaries == []
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_an_answer_cut_by_a_crash_is_shown_marked(home):
    from dflash_chat.chat.conversation import PARTIAL, Message

    store = HistoryStore(paths.history_db())
    cid = store.create("crashed")
    store.add(cid, Message("user", "go on"))
    store.add(cid, Message("assistant", "Half an ans", status=PARTIAL))
    store.close()

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            await app.chat.open_conversation(cid)
            await pilot.pause()
            widget = app.chat.query(AssistantMessage).last()
            return widget.answer.source, str(widget.query_one(".status").render())

    text, status = run(main())
    assert text == "Half an ans" and "interrupted" in status
