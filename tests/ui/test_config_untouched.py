"""config.toml is the user's: the app never writes it as a side effect of reading it, and an
explicit change (a theme picked, the settings screen) edits only that line. Compared byte for byte."""

from __future__ import annotations

import pytest
from textual.widgets import Input, Select

from dflash_chat import paths
from dflash_chat import settings as settings_module
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.settings_screen import SettingsScreen

from .conftest import run, wait_for, write_config

COMMENTED = """\
# my settings
theme = "no-such-theme"   # one I had once
temperature = 0.5

[models.mine]            # my GGUFs
target = { path = "/m/t.gguf" }
"""


def notices(app) -> list[tuple[str, float]]:
    return [(n.message, n.timeout) for n in app._notifications]


@pytest.mark.parametrize(
    "text, theme_file",
    [
        (COMMENTED, None),
        ('theme = "no-such-theme"\n', None),
        ('theme = "mine"  # mine\n', "name = 'mine'\nprimary = \n"),  # not valid TOML
        ('theme = "mine"\n', "name = 'mine'\nprimary = 'blurple'\n"),  # not a colour
    ],
)
def test_a_theme_that_cannot_be_used_is_reported_and_config_toml_is_not_written(home, text, theme_file):
    config = write_config(text)
    if theme_file:
        paths.user_themes_dir().mkdir(parents=True)
        (paths.user_themes_dir() / "mine.toml").write_text(theme_file)
    wanted = settings_module.load().theme

    async def main():
        app = DFlashChatApp(settings_module.load())
        async with app.run_test(size=(120, 36)) as pilot:
            for _ in range(5):
                await pilot.pause(0.1)
            return app.theme, notices(app)

    theme, said = run(main())
    assert config.read_text() == text and config.stat().st_mode & 0o777 == 0o644
    assert theme == "dflash-dark"
    about = [(m, t) for m, t in said if repr(wanted) in m]
    assert about and about[0][1] >= 24 * 3600  # stays until dismissed
    if theme_file:
        assert "mine.toml" in about[0][0]


def test_picking_a_theme_edits_only_the_theme_line(home):
    config = write_config(COMMENTED)

    async def main():
        app = DFlashChatApp(settings_module.load())
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            app.theme = "dflash-high-contrast"  # what the palette's theme picker does
            for _ in range(3):
                await pilot.pause()

    run(main())
    assert config.read_text() == COMMENTED.replace('"no-such-theme"', '"dflash-high-contrast"')
    assert config.stat().st_mode & 0o777 == 0o644


def test_the_settings_screen_edits_only_what_was_changed(home):
    config = write_config(COMMENTED)

    async def main():
        app = DFlashChatApp(settings_module.load())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            app.screen.query_one("#field-top_k", Input).value = "7"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to chat")

    run(main())
    assert config.read_text() == COMMENTED.replace("temperature = 0.5\n", "temperature = 0.5\ntop_k = 7\n")


def test_saving_the_settings_into_a_broken_file_says_not_saved_and_keys_typed_next_change_no_field(home):
    broken = "temperature = = 1\n"
    config = write_config(broken)

    async def main():
        app = DFlashChatApp(settings_module.read()[0])
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            screen = app.screen
            screen.query_one("#field-top_k", Input).value = "7"
            await pilot.press("ctrl+s")
            await pilot.pause()
            said = [m for m, _ in notices(app) if m.startswith("Not saved: ")]
            await pilot.press(*"hello")
            await pilot.pause()
            fields = {i.id: i.value for i in screen.query(Input)}
            return app.screen is screen, said, fields

    still_open, said, fields = run(main())
    assert still_open and len(said) == 1 and "is not valid TOML" in said[0] and "Your edits are kept here" in said[0]
    assert fields["field-top_k"] == "7" and fields["field-temperature"] == "0.7"  # "hello" went to no field
    assert config.read_text() == broken


def test_the_vision_setting_is_a_choice_on_the_settings_screen(home):
    config = write_config(COMMENTED)

    async def main():
        app = DFlashChatApp(settings_module.load())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            field = app.screen.query_one("#field-vision", Select)
            assert field.value == "auto" and [label for label, _ in field._options] == ["auto", "off"]
            field.value = "off"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to chat")
            assert app.settings.vision == "off"

    run(main())
    assert config.read_text() == COMMENTED.replace("temperature = 0.5\n", 'temperature = 0.5\nvision = "off"\n')


@pytest.mark.parametrize(
    "content, said",
    [
        (b"temperature = = 1\n", "not valid TOML"),
        (b"top_k = 5\n\xff\xfe\n", "not UTF-8"),
        (None, "is a folder"),
        (b"temperature = 5  # too hot\n", "temperature must be a number from 0 to 2"),
        (b'keymap = "stop=f5"\n', "keymap must be a table"),
        (b'[keymap]\nstop = "ctrl+t"\n', "ctrl+t is also toggle-thinking's key"),
        (b"temprature = 0.5\n", "unknown setting 'temprature'"),
        (b'theme = "gone"\n', "Theme 'gone' cannot be used"),
        (
            b"draft = 0  # none?\n",
            "draft must be auto, off or a number of drafts per step (1-64), got 0; fix or "
            "remove that line (using 'auto' meanwhile)",
        ),
    ],
)
def test_the_app_starts_on_any_config_toml_says_what_it_cannot_use_and_leaves_it_as_it_is(
    home, monkeypatch, content, said
):
    """Through the command's own path (flags, settings.read, build_app), as `dflash-chat --target PATH` runs it."""
    from dflash_chat import cli
    from dflash_chat.commands.chat import build_app

    config = paths.config_file()
    config.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        config.mkdir()
    else:
        config.write_bytes(content)
    args = cli.build_parser().parse_args(["--target", str(home / "no-model")])  # fails to load: said, the app stays

    async def main():
        app = build_app(args, *settings_module.read())
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: any(said in m for m, _ in notices(app)), 30, "the problem to be said")
            await wait_for(pilot, lambda: app.chat.sub_title == "no model", 30, "the model choice to end")
            return notices(app)

    said_all = run(main())
    assert [t for m, t in said_all if said in m][0] >= 24 * 3600  # stays until dismissed
    if content is None:
        assert config.is_dir() and not any(config.iterdir())
    else:
        assert config.read_bytes() == content
