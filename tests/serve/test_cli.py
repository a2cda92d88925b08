"""The command line around serving: named endpoints in the settings and in `models`, --endpoint and
--api-key, `serve`'s one-line errors, and `bench --http`."""

from __future__ import annotations

import socket

import pytest
import tomlkit

from dflash_chat import cli, paths
from dflash_chat import settings as settings_module
from dflash_chat.commands.chat import build_app
from dflash_chat.errors import UserError
from dflash_chat.settings import Settings


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "home"


def test_named_endpoints_are_saved_listed_and_used(home, capsys):
    assert (
        cli.main(
            ["--set", "endpoints.big-box=http://10.0.0.5:8000/v1", "--set", "endpoints.laptop=http://127.0.0.1:8000"]
        )
        == 0
    )
    saved = tomlkit.parse(paths.config_file().read_text())
    assert dict(saved["endpoints"]) == {"big-box": "http://10.0.0.5:8000/v1", "laptop": "http://127.0.0.1:8000"}
    assert cli.main(["--set", "endpoints.laptop="]) == 0  # an empty value removes one
    assert settings_module.load().endpoints == {"big-box": "http://10.0.0.5:8000/v1"}
    assert cli.main(["--set", "endpoints.bad=ftp://x"]) == 2
    assert "endpoints bad must be an http:// or https:// URL" in capsys.readouterr().err

    capsys.readouterr()
    assert cli.main(["models", "--vram", "24"]) == 0
    out = capsys.readouterr().out
    assert "Endpoints (dflash-chat --endpoint NAME):" in out and "big-box  http://10.0.0.5:8000/v1" in out

    current = settings_module.load()
    app = build_app(cli.build_parser().parse_args(["--endpoint", "big-box", "--api-key", "k"]), current)
    endpoint = app.chat.backend.endpoint
    assert (endpoint.base, endpoint.api_key, endpoint.name) == ("http://10.0.0.5:8000/v1", "k", "big-box")
    app.store.close()
    app = build_app(cli.build_parser().parse_args(["--endpoint", "http://127.0.0.1:8080/"]), current)
    assert app.chat.backend.endpoint.base == "http://127.0.0.1:8080/v1"  # the /v1 an OpenAI server serves under
    assert app.chat.backend.endpoint.root == "http://127.0.0.1:8080"
    app.store.close()


def test_each_named_endpoint_reads_its_own_key_variable(home, monkeypatch, capsys):
    assert (
        cli.main(["--set", "endpoints.big-box=http://10.0.0.5:8000/v1", "--set", "endpoints.lab=http://lab:8000"]) == 0
    )
    monkeypatch.setenv("DFLASH_CHAT_API_KEY_BIG_BOX", "big-key")
    monkeypatch.setenv("DFLASH_CHAT_API_KEY", "general-key")
    current = settings_module.load()

    def key(argv):
        app = build_app(cli.build_parser().parse_args(argv), current)
        app.store.close()
        return app.chat.backend.endpoint.api_key

    assert key(["--endpoint", "big-box"]) == "big-key"
    assert key(["--endpoint", "big-box", "--api-key", "typed"]) == "typed"
    assert key(["--endpoint", "lab"]) == "general-key"  # no variable of its own
    assert key(["--endpoint", "http://10.0.0.5:8000/v1"]) == "general-key"  # a URL is no name
    monkeypatch.delenv("DFLASH_CHAT_API_KEY")
    assert key(["--endpoint", "lab"]) is None
    assert "key" not in paths.config_file().read_text()  # keys stay out of the settings file

    capsys.readouterr()
    assert cli.main(["models", "--vram", "24"]) == 0
    out = capsys.readouterr().out
    assert "key: DFLASH_CHAT_API_KEY_BIG_BOX (set)" in out and "key: DFLASH_CHAT_API_KEY_LAB (not set)" in out


def test_models_says_how_to_name_an_endpoint_when_none_is(home, capsys):
    assert cli.main(["models", "--vram", "24"]) == 0
    assert "Endpoints: none saved (dflash-chat --set endpoints.NAME=URL" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--endpoint", "ftp://box"], "is not an http(s) URL"),
        (["--endpoint", "nowhere"], "is not an http(s) URL"),
        (["--endpoint", "http://box:8000", "--demo"], "leave out --demo"),
        (["--endpoint", "http://box:8000", "--model", "qwen3.6-27b"], "leave out --model"),
        (["--api-key", "k"], "--api-key goes with --endpoint"),
    ],
)
def test_endpoint_flags_that_do_not_go_together_are_one_line(home, argv, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        build_app(cli.build_parser().parse_args(argv), Settings())


def test_serve_on_a_port_in_use_says_so_before_loading(home, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert cli.main(["serve", "--demo", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is in use: pass another --port" in err and "Traceback" not in err
    assert cli.main(["serve", "--demo", "--port", "70000"]) == 2  # refused by the flag's own check
    assert "--port" in capsys.readouterr().err


def test_bench_http_prints_in_process_and_http_figures(home, capsys):
    pytest.importorskip("fastapi")
    from dflash_chat.models.demo import demo_available

    if not demo_available():
        pytest.skip("the demo pair is not in dflash_chat/demo_data")
    assert cli.main(["bench", "--demo", "--http", "--prompts", "2", "--tokens", "8", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "in-process" in out and "HTTP (SSE)" in out and "same text: yes" in out
    assert "ms per token" in out and "x tok/s" in out
    assert cli.main(["bench", "--http"]) == 2
    assert "--http measures a real pair" in capsys.readouterr().err


def test_serve_with_files_that_do_not_load_stops_with_their_error(home, tmp_path, capsys):
    assert cli.main(["serve", "--target", str(tmp_path / "no-model"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "serving no-model on http://localhost:" in err
    assert err.strip().splitlines()[-1].startswith("dflash-chat: target ") and "does not exist" in err
    assert "Traceback" not in err
