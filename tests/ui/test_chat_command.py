"""`dflash-chat` (no subcommand): --set, model flags, one-line errors."""

from __future__ import annotations

import pytest

from dflash_chat import cli, paths
from dflash_chat import settings as settings_module
from dflash_chat.models import demo
from dflash_chat.runtime import model_source
from dflash_chat.runtime.model_source import ModelSource, Pick, resolve
from dflash_chat.settings import Settings

from .conftest import write_config


def test_set_saves_and_exits(home, capsys, tmp_path):
    code = cli.main(["--set", "temperature=0.2", "--set", "thinking=on", "--set", f"model={tmp_path}/m"])
    out = capsys.readouterr().out
    assert code == 0
    assert "temperature = 0.2" in out and "saved to" in out
    saved = settings_module.load()
    assert (saved.temperature, saved.thinking, saved.model) == (0.2, True, str(tmp_path / "m"))


def test_set_refuses_bad_values_in_one_line_and_keeps_the_file(home, capsys):
    cli.main(["--set", "top_k=5"])
    before = paths.config_file().read_bytes()
    code = cli.main(["--set", "temperature=warm"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == "dflash-chat: temperature must be a number from 0 to 2 (0 = greedy), got 'warm'"
    assert paths.config_file().read_bytes() == before
    assert cli.main(["--set", "colour=red"]) == 2
    assert "unknown setting 'colour'" in capsys.readouterr().err


def test_set_draft_saves_a_word_or_a_number_and_refuses_the_rest_in_one_line(home, capsys):
    assert cli.main(["--set", "draft=7"]) == 0
    assert paths.config_file().read_text() == "draft = 7\n" and settings_module.load().draft == 7
    assert cli.main(["--set", "draft=Off"]) == 0
    assert paths.config_file().read_text() == 'draft = "off"\n'
    capsys.readouterr()
    assert cli.main(["--set", "draft=0"]) == 2
    assert capsys.readouterr().err == (
        "dflash-chat: draft must be auto, off or a number of drafts per step (1-64), got '0'\n"
    )
    assert paths.config_file().read_text() == 'draft = "off"\n'


def test_broken_config_is_one_line(home, capsys):
    paths.config_file().parent.mkdir(parents=True)
    paths.config_file().write_text("temperature = [\n")
    assert cli.main(["--set", "top_k=1"]) == 2
    err = capsys.readouterr().err
    assert "not valid TOML" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_model_flags_resolve_in_order():
    saved = Settings(model="/saved/target", drafter="/saved/drafter")
    assert resolve(saved, target="/t", drafter="/d") == ModelSource("/t", "/d")
    assert resolve(saved, target="/t") == ModelSource("/t", None)
    assert resolve(saved) == ModelSource("/saved/target", "/saved/drafter")
    assert resolve(Settings()) == Pick()  # nothing named: the model manager chooses at start
    with pytest.raises(Exception, match="--drafter needs --target"):
        resolve(Settings(), drafter="/d")


def test_demo_without_demo_files_is_one_line(home, capsys, monkeypatch):
    monkeypatch.setattr(demo, "demo_dir", lambda: home / "no-demo-data")  # an install without it
    for argv in (["--demo"], ["run", "--demo", "--prompt", "hi"], ["bench", "--demo"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "demo model is not part of this build" in err and "--target DIR" in err


def test_nothing_named_lets_the_model_manager_choose(monkeypatch):
    """The demo pair only on request here; without a GPU the model manager picks it (test_first_run)."""
    demo = ModelSource("/demo/target", "/demo/drafter", demo=True)
    monkeypatch.setattr(model_source, "demo_source", lambda: demo)
    assert resolve(Settings()) == Pick()
    assert resolve(Settings(), demo=True) == demo
    assert resolve(Settings(model="/mine")) == ModelSource("/mine", None)


def test_flags_reach_the_app(home, tmp_path):
    from dflash_chat.commands.chat import build_app

    args = cli.build_parser().parse_args(
        [
            "--target",
            str(tmp_path / "t"),
            "--drafter",
            str(tmp_path / "d"),
            "--data-dir",
            str(tmp_path / "data"),
            "--draft",
            "5",
        ]
    )
    app = build_app(args, Settings())
    try:
        assert app.chat.backend.request == ModelSource(str(tmp_path / "t"), str(tmp_path / "d"))
        assert app.chat.backend.settings.draft == 5 and not paths.config_file().exists()  # this session's only
        assert app.store.path == tmp_path / "data" / "history.sqlite3"
        assert app.store.path.exists()
    finally:
        app.store.close()


USER_FILE = """\
# my dflash-chat settings
temperature   = 0.5    # warm
theme = "dflash-light"

[keymap]
# keys I like
stop = "ctrl+g"   # like emacs

[models.mine]          # my own GGUFs
target = { path = "~/m/t.gguf" }
"""


def test_set_edits_one_key_in_place_and_keeps_every_other_byte(home, capsys):
    config = write_config(USER_FILE)
    assert cli.main(["--set", "temperature=0.2"]) == 0
    assert config.read_text() == USER_FILE.replace("temperature   = 0.5 ", "temperature   = 0.2 ")
    assert config.stat().st_mode & 0o777 == 0o644
    assert cli.main(["--set", "keymap.new-chat=f5"]) == 0
    assert config.read_text() == USER_FILE.replace("temperature   = 0.5 ", "temperature   = 0.2 ").replace(
        'stop = "ctrl+g"   # like emacs\n', 'stop = "ctrl+g"   # like emacs\nnew-chat = "f5"\n'
    )


@pytest.mark.parametrize(
    "assignment, fragment",
    [
        ("theme=nosuch", "theme must be one of dflash-dark"),
        ("theme=", "theme cannot be empty"),
        ("keymap=stop", "binding-id=keys"),
        ("keymap=no-such-id=f5", "unknown binding id 'no-such-id'"),
        ("keymap.stop=ctrl+t", "ctrl+t is also toggle-thinking's key"),
        ("keymap.stop=enter", "enter is kept for sending the message"),
        ("keymap.stop=q", "types a character"),
    ],
)
def test_set_validates_theme_and_keymap_like_every_other_key(home, capsys, assignment, fragment):
    config = write_config(USER_FILE)
    assert cli.main(["--set", assignment]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err
    assert config.read_text() == USER_FILE


def test_set_theme_accepts_a_users_theme_file_and_says_why_a_broken_one_is_not(home, capsys):
    themes = paths.user_themes_dir()
    themes.mkdir(parents=True)
    (themes / "sunset.toml").write_text("primary = '#ff8800'\n")
    (themes / "broken.toml").write_text("primary = 'blurple'\n")
    assert cli.main(["--set", "theme=sunset"]) == 0
    assert settings_module.load().theme == "sunset"
    assert cli.main(["--set", "theme=broken"]) == 2
    assert "theme 'broken' cannot be used" in capsys.readouterr().err


def test_set_notes_what_else_in_the_file_cannot_be_used(home, capsys):
    config = write_config('theme = "gone"\ntop_p = 7\n')
    assert cli.main(["--set", "top_k=3"]) == 0
    err = capsys.readouterr().err
    assert "top_p must be a number greater than 0 and at most 1" in err and "Traceback" not in err
    assert config.read_text() == 'theme = "gone"\ntop_p = 7\ntop_k = 3\n'
