"""User files that cannot be used (Pilot): each is named in a notice, the default is used meanwhile,
the app starts at once (no hang on a FIFO, a folder, a huge file) and no file is changed."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from dflash_chat import paths
from dflash_chat import settings as settings_module
from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.themes import ThemeFileError, discover_themes, load_theme_file

from .conftest import run

SHIPPED_DARK = """name = "dflash-dark"
dark = true
primary = "#5FA8D3"
background = "#14181D"
[variables]
"block-cursor-foreground" = "%s"
"""


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


def snapshot(folder):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


def start(settings: Settings):
    async def main():
        app = DFlashChatApp(settings)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            return app.theme, notes(app), app.return_code

    started = time.monotonic()
    result = run(main())
    assert time.monotonic() - started < 10
    return result


@pytest.mark.parametrize("value", ["not a colour;}", "bogus", "#12345", "bold", "$primary"])
@pytest.mark.parametrize("chosen", ["dflash-dark", "dflash-light"])
def test_a_bad_variable_in_a_file_shadowing_a_shipped_theme_is_named_and_the_shipped_one_shown(home, value, chosen):
    themes = paths.user_themes_dir()
    themes.mkdir(parents=True)
    (themes / "dflash-dark.toml").write_text(SHIPPED_DARK % value)
    before = snapshot(themes)
    theme, messages, code = start(Settings(theme=chosen))
    assert theme == chosen and code is None
    assert any("dflash-dark.toml was skipped" in m and "block-cursor-foreground" in m for m in messages), messages
    assert snapshot(themes) == before


def test_text_style_variables_are_checked_as_styles(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('primary = "#fff"\n[variables]\n"block-cursor-text-style" = "bold underline"\n')
    load_theme_file(path)
    path.write_text('primary = "#fff"\n[variables]\n"block-cursor-text-style" = "sparkly"\n')
    with pytest.raises(ThemeFileError, match="bold underline"):
        load_theme_file(path)


def test_unusual_files_in_the_themes_folder_are_skipped_without_a_hang(home, tmp_path):
    themes = paths.user_themes_dir()
    themes.mkdir(parents=True)
    os.mkfifo(themes / "fifo.toml")
    (themes / "folder.toml").mkdir()
    (themes / "huge.toml").write_bytes(b"# " + b"x" * (2 << 20))
    (themes / "latin1.toml").write_bytes(b'primary = "#fff"\nname = "caf\xe9"\n')
    (themes / "good.toml").write_text('primary = "#ff00ff"\n')
    os.symlink(themes / "nowhere", themes / "dangling.toml")
    started = time.monotonic()
    found = discover_themes(themes)
    assert time.monotonic() - started < 2
    assert "good" in found.names
    said = "\n".join(found.problems)
    assert said.count("is not a regular file") == 2  # the FIFO and the folder
    assert "too large for a theme file" in said and "not UTF-8 text" in said and "dangling.toml" in said
    theme, messages, _ = start(Settings(theme="good"))
    assert theme == "good" and any("fifo.toml" in m for m in messages)


def test_a_config_that_is_a_fifo_a_folder_or_huge_is_named_and_defaults_are_used(home):
    config = paths.config_file()
    config.parent.mkdir(parents=True, exist_ok=True)
    for make, words in (
        (lambda: os.mkfifo(config), "not a regular file"),
        (lambda: config.mkdir(), "is a folder"),
        (lambda: config.write_bytes(b"#" * (2 << 20)), "far too large"),
        (lambda: config.write_bytes(b"theme = '\xff'\n"), "not UTF-8"),
    ):
        make()
        started = time.monotonic()
        settings, problems = settings_module.read()
        assert time.monotonic() - started < 1 and settings == Settings()
        assert len(problems) == 1 and words in problems[0] and str(config) in problems[0]
        config.rmdir() if config.is_dir() else config.unlink()
