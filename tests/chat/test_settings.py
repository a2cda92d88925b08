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
    saved = replace(settings.load(), temperature=settings.parse_value("temperature", "0.25"),
                    thinking=settings.parse_value("thinking", "on"))
    settings.save(saved)
    document = tomllib.loads(path.read_text())
    assert document["models"] == {"mine": {"target": "/m/t.gguf"}}
    assert document["extra"] == [{"x": 1}]
    assert document["temperature"] == 0.25 and document["thinking"] is True
    assert settings.load() == saved


def test_defaults_are_not_written(home):
    settings.save(Settings(top_k=5))
    document = tomllib.loads(paths.config_file().read_text())
    assert document == {"top_k": 5}


@pytest.mark.parametrize(
    "key, text, fragment",
    [
        ("temperature", "hot", "must be a number"),
        ("temperature", "3", "between 0.0 and 2.0"),
        ("top_p", "-0.1", "between"),
        ("top_k", "2.5", "whole number"),
        ("max_new_tokens", "0", "between"),
        ("thinking", "maybe", "on or off"),
        ("theme", " ", "cannot be empty"),
        ("context_length", "12", "between"),
        ("keymap", "stop", "binding-id=keys"),
        ("colour", "red", "unknown setting"),
    ],
)
def test_invalid_values_are_refused_with_a_message(key, text, fragment):
    with pytest.raises(SettingsError, match=fragment):
        settings.parse_value(key, text)


def test_typed_values():
    assert settings.parse_value("top_k", "40") == 40 and settings.parse_value("thinking", "false") is False
    assert settings.parse_value("keymap", "toggle-thinking=f5; stop=ctrl+g") == {"toggle-thinking": "f5", "stop": "ctrl+g"}


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


def test_broken_toml_is_a_user_error(home):
    path = paths.config_file()
    path.parent.mkdir(parents=True)
    path.write_text("temperature = = 1\n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        settings.load()


def test_failed_write_leaves_old_file_whole(home, monkeypatch):
    settings.save(Settings(top_k=7))
    before = paths.config_file().read_bytes()

    def boom(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        settings.save(Settings(top_k=9))
    assert paths.config_file().read_bytes() == before
    leftovers = [p.name for p in paths.config_dir().iterdir() if p.name != "config.toml"]
    assert leftovers == []
