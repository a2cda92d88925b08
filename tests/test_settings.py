from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest

from dflash_chat import paths, settings
from dflash_chat.settings import Settings, SettingsError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path))
    return tmp_path


def test_missing_file_gives_defaults(home):
    assert settings.load() == Settings()


def test_round_trip_keeps_other_tables(home):
    path = paths.config_file()
    path.parent.mkdir(parents=True)
    path.write_text('[models.mine]\ntarget = "/m/t.gguf"\n\n[[extra]]\nx = 1\n')
    saved = replace(
        settings.load(),
        temperature=settings.parse_value("temperature", "0.25"),
        thinking=settings.parse_value("thinking", "on"),
    )
    settings.update(settings.changes(Settings(), saved))
    document = tomllib.loads(path.read_text())
    assert document["models"] == {"mine": {"target": "/m/t.gguf"}}
    assert document["extra"] == [{"x": 1}]
    assert document["temperature"] == 0.25 and document["thinking"] is True
    assert settings.load() == saved


def test_only_changed_values_are_written(home):
    settings.update(settings.changes(Settings(), Settings(top_k=5)))
    assert paths.config_file().read_text() == "top_k = 5\n"
    assert settings.changes(Settings(), Settings()) == {}


@pytest.mark.parametrize(
    "key, text, fragment",
    [
        ("temperature", "hot", "must be a number"),
        ("temperature", "3", "from 0 to 2"),
        ("top_p", "-0.1", "greater than 0 and at most 1"),
        ("top_p", "0", "greater than 0 and at most 1"),
        ("top_k", "2.5", "whole number"),
        ("min_p", "1.5", "from 0 to 1"),
        ("max_new_tokens", "0", "from 1 to 1000000"),
        ("thinking", "maybe", "on or off"),
        ("theme", " ", "cannot be empty"),
        ("context_length", "12", "from 256 to 1048576"),
        ("keymap", "stop", "binding-id=keys"),
        ("keymap", 5, "must be a table"),
        ("keymap", {"stop": ""}, "must be a table"),
        ("temperature", "nan", "from 0 to 2"),
        ("max_new_tokens", True, "must be a whole number"),
        ("colour", "red", "unknown setting"),
        ("draft", "0", r"draft must be auto, off or a number of drafts per step \(1-64\), got '0'"),
        ("draft", 65, "1-64"),
        ("draft", "some", "auto, off or a number"),
        ("draft", 2.5, "auto, off or a number"),
        ("draft", True, "auto, off or a number"),
        ("decode", "fast", "must be one of auto, graphs, fixed"),
        ("speculate", "eagle", r"speculate must be auto, dflash, mtp, lookup or none, got 'eagle'"),
        ("speculate", 3, "auto, dflash, mtp, lookup or none"),
        (
            "vision",
            "on",
            r"vision must be auto \(the vision tower loads where it fits beside the model\) or off, got 'on'",
        ),
        ("vision", False, "auto .* or off, got False"),
        ("previews", "graphics", r"previews must be one of auto, kitty, sixel, blocks, got 'graphics'"),
        ("previews", 3, "previews must be one of auto, kitty, sixel, blocks, got 3"),
        ("prefix_cache_mib", "-1", "prefix_cache_mib must be a whole number from 0 to 1048576"),
        ("prefix_cache_mib", "lots", "prefix_cache_mib must be a whole number"),
        ("prefix_cache_mib", 1.5, "whole number"),
    ],
)
def test_invalid_values_are_refused_with_a_message(key, text, fragment):
    with pytest.raises(SettingsError, match=fragment):
        settings.parse_value(key, text)


def test_typed_values():
    assert settings.parse_value("top_k", "40") == 40 and settings.parse_value("thinking", "false") is False
    assert settings.parse_value("keymap", "toggle-thinking=f5; stop=ctrl+g") == {
        "toggle-thinking": "f5",
        "stop": "ctrl+g",
    }


def test_draft_is_a_word_or_a_number_and_eager_is_fixed():
    assert [settings.parse_value("draft", v) for v in ("AUTO", " off", "7", 7, 64.0)] == ["auto", "off", 7, 7, 64]
    assert settings.parse_value("decode", "eager") == "fixed"  # its older name
    assert settings.parse_assignment("draft=3") == ("draft", 3)
    assert settings.parse_assignment("speculate=MTP") == ("speculate", "mtp")
    assert settings.parse_assignment("vision= OFF") == ("vision", "off") and settings.Settings().vision == "auto"
    assert settings.parse_assignment("previews= Kitty") == ("previews", "kitty") and Settings().previews == "auto"


def test_a_bad_previews_value_in_the_file_is_one_line_and_the_default_meanwhile(home):
    write_config('previews = "sixels"\ntemperature = 0.2\n')
    current, problems = settings.read()
    assert current == Settings(temperature=0.2)
    assert len(problems) == 1 and "\n" not in problems[0]
    assert problems[0].endswith(
        "previews must be one of auto, kitty, sixel, blocks, got 'sixels'; fix or remove that line (using 'auto' "
        "meanwhile)"
    )


def test_parse_assignment():
    assert settings.parse_assignment("max_new_tokens = 64") == ("max_new_tokens", 64)
    with pytest.raises(SettingsError, match="key=value"):
        settings.parse_assignment("temperature")


def test_invalid_file_value_names_the_file(home):
    path = paths.config_file()
    path.parent.mkdir(parents=True)
    path.write_text('top_p = "lots"\n')
    with pytest.raises(SettingsError, match="config.toml: top_p must be a number"):
        settings.load()


def test_the_prefix_cache_budget_goes_to_the_engine_and_a_bad_one_is_one_line(home):
    from dflash_chat.runtime.loader import LoadOptions

    assert LoadOptions.of(Settings()).prefix_cache_mib == 1024
    assert LoadOptions.of(Settings(prefix_cache_mib=0)).prefix_cache_mib == 0
    path = paths.config_file()
    path.parent.mkdir(parents=True)
    path.write_text("prefix_cache_mib = -5\n")
    with pytest.raises(SettingsError) as caught:
        settings.load()
    assert str(caught.value).count("\n") == 0
    assert "prefix_cache_mib must be a whole number from 0 to 1048576" in str(caught.value)


def test_broken_toml_is_a_user_error(home):
    path = paths.config_file()
    path.parent.mkdir(parents=True)
    path.write_text("temperature = = 1\n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        settings.load()


def test_a_broken_file_is_said_in_one_wording_by_the_app_doctor_and_set(home, capsys):
    from dflash_chat.cli import main

    path = write_config("temperature = = 1\n")
    with pytest.raises(SettingsError) as loaded:
        settings.load()
    with pytest.raises(SettingsError) as updated:
        settings.update({"top_k": 5})
    (read,) = settings.read()[1]
    assert str(loaded.value) == str(updated.value) and read.startswith(str(loaded.value))
    assert main(["--set", "top_k=5"]) == 2
    assert capsys.readouterr().err == f"dflash-chat: {loaded.value}\n"
    assert path.read_text() == "temperature = = 1\n"


def test_a_file_that_begins_with_a_utf8_bom_is_read_and_an_edit_keeps_the_bom(home):
    """Notepad writes one: the file is as valid as without it, and an edit changes only its line."""
    path = write_config("\ufeff" + USER_FILE)
    assert settings.read() == (settings.load(), [])
    assert settings.load().temperature == 0.5 and settings.load().keymap == {"stop": "ctrl+g"}
    settings.update({"temperature": 0.2})
    assert path.read_bytes() == ("\ufeff" + USER_FILE.replace("temperature   = 0.5 ", "temperature   = 0.2 ")).encode()


def test_failed_write_leaves_old_file_whole(home, monkeypatch):
    settings.update({"top_k": 7})
    before = paths.config_file().read_bytes()

    def boom(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        settings.update({"top_k": 9})
    assert paths.config_file().read_bytes() == before
    leftovers = [p.name for p in paths.config_dir().iterdir() if p.name != "config.toml"]
    assert leftovers == []


USER_FILE = """\
# my dflash-chat settings
temperature   = 0.5    # warm, but not too warm
theme = "dflash-light"

# chat
system_prompt = 'Be brief.'

[keymap]
# keys I like
stop = "ctrl+g"   # like emacs

[models.mine]          # my own GGUFs
target = { path = "~/m/t.gguf" }
"""


def write_config(text: str, mode: int = 0o644):
    path = paths.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_update_changes_one_line_and_keeps_every_other_byte(home):
    path = write_config(USER_FILE, 0o640)
    settings.update({"temperature": 0.2})
    assert path.read_text() == USER_FILE.replace("temperature   = 0.5 ", "temperature   = 0.2 ")
    assert path.stat().st_mode & 0o777 == 0o640


def test_update_adds_new_keys_with_the_other_top_level_keys(home):
    path = write_config(USER_FILE)
    settings.update({"top_k": 5, "keymap": {"stop": "ctrl+g", "new-chat": "f5"}})
    text = path.read_text()
    assert text == USER_FILE.replace(
        "system_prompt = 'Be brief.'\n", "system_prompt = 'Be brief.'\ntop_k = 5\n"
    ).replace('stop = "ctrl+g"   # like emacs\n', 'stop = "ctrl+g"   # like emacs\nnew-chat = "f5"\n')
    assert settings.load() == Settings(
        temperature=0.5,
        theme="dflash-light",
        system_prompt="Be brief.",
        top_k=5,
        keymap={"stop": "ctrl+g", "new-chat": "f5"},
    )


def test_a_symlinked_config_stays_a_symlink(home, tmp_path):
    real = tmp_path / "dotfiles" / "dflash.toml"
    real.parent.mkdir()
    real.write_text("top_k = 3\n")
    paths.config_dir().mkdir(parents=True)
    paths.config_file().symlink_to(real)
    settings.update({"top_k": 4})
    assert paths.config_file().is_symlink() and real.read_text() == "top_k = 4\n"


def test_a_new_file_gets_the_usual_permissions(home):
    old = os.umask(0o022)
    try:
        settings.update({"top_k": 4})
    finally:
        os.umask(old)
    assert paths.config_file().stat().st_mode & 0o777 == 0o644


def test_nothing_to_change_writes_nothing(home):
    path = write_config(USER_FILE)
    before = path.stat().st_mtime_ns
    settings.update({})
    settings.update({"temperature": 0.5})  # the value it has
    assert path.read_text() == USER_FILE and path.stat().st_mtime_ns == before


def test_read_reports_what_it_cannot_use_and_never_raises(home):
    write_config('temperature = 5\ntheme = "mine"\nkeymap = "stop=f5"\ncolour = "red"\n[models.x]\nextends = "y"\n')
    current, problems = settings.read()
    assert current == Settings(theme="mine")
    assert len(problems) == 3
    assert "temperature must be a number from 0 to 2 (0 = greedy), got 5" in problems[0]
    assert "using 0.7 meanwhile" in problems[0]
    assert "keymap must be a table" in problems[1]
    assert "unknown setting 'colour'" in problems[2]
    write_config("temperature = = 1\n")
    current, problems = settings.read()
    assert current == Settings() and "not valid TOML" in problems[0] and "default settings" in problems[0]
    write_config("")
    paths.config_file().write_bytes(b"top_k = 5\n\xff\n")
    assert "not UTF-8" in settings.read()[1][0]


def test_keymap_entries_from_the_command_line():
    assert settings.parse_assignment("keymap.stop=ctrl+g", {"new-chat": "f5"}) == (
        "keymap",
        {"new-chat": "f5", "stop": "ctrl+g"},
    )
    assert settings.parse_assignment("keymap.new-chat=", {"new-chat": "f5"}) == ("keymap", {})


def test_flags_use_the_settings_rules():
    import argparse

    check = settings.flag("max_new_tokens")
    assert check("12") == 12
    with pytest.raises(argparse.ArgumentTypeError, match="must be a whole number from 1 to 1000000, got 0"):
        check("0")


def test_an_equal_value_keeps_the_users_spelling(home):
    path = write_config("temperature = 0.50  # two places\nthinking = true\n")
    settings.update({"temperature": 0.5, "thinking": True})
    assert path.read_text() == "temperature = 0.50  # two places\nthinking = true\n"
    path = write_config("thinking = 1\n")
    settings.update({"thinking": True})
    assert path.read_text() == "thinking = true\n"


def test_the_drafter_settings_hint_says_what_an_empty_one_does():
    """The settings screen shows it: the demo with the field empty drafts with its DFlash2 drafter, and a model
    without a drafter still drafts with its MTP layer and prompt lookup, so "empty = plain decoding" was untrue."""
    from dflash_chat.runtime.model_source import resolve

    hint = settings.DESCRIPTIONS["drafter"]
    assert "plain decoding" not in hint
    assert resolve(Settings(drafter=""), demo=True).drafter is not None and "empty: the pair's or demo's own" in hint
    assert "else MTP and lookup draft" in hint
