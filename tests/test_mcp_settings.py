"""The [mcp] table of config.toml: typed and checked, a bad server named and skipped alone, and `--set mcp.…`
editing only the value asked for (every other byte of the file kept)."""

from __future__ import annotations

import pytest

from dflash_chat import cli, paths, settings
from dflash_chat.mcp_config import McpServer, McpSettings
from dflash_chat.settings import SettingsError

USER_FILE = """\
temperature = 0.5   # mine

[mcp]
rounds = 4          # fewer rounds

[mcp.servers.files]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
env = { NOTES = "1" }

[mcp.servers.broken]
command = "x"
url = "http://y/mcp"

[mcp.servers.search]
url = "http://127.0.0.1:8931/mcp"
enabled = false
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path))
    return tmp_path


def write(text: str):
    path = paths.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_servers_are_read_typed_and_a_bad_one_is_named_and_skipped_alone(home):
    write(USER_FILE)
    read, problems = settings.read()
    assert read.temperature == 0.5 and read.mcp.rounds == 4 and read.mcp.timeout == 60
    assert read.mcp.servers == {
        "files": McpServer("npx", ("-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"), {"NOTES": "1"}),
        "search": McpServer(url="http://127.0.0.1:8931/mcp", enabled=False),
    }
    assert list(read.mcp.enabled) == ["files"]
    assert len(problems) == 1 and "[mcp.servers.broken] has both command and url" in problems[0]
    assert "that server is skipped" in problems[0]
    with pytest.raises(SettingsError, match=r"\[mcp.servers.broken\] has both command and url"):
        settings.load()  # doctor's strict read names the same problem


@pytest.mark.parametrize(
    "table, fragment",
    [
        ({"servers": {"a": {}}}, '[mcp.servers.a] needs command = "..." (a program to start) or url'),
        ({"servers": {"a": {"command": "x", "cmd": "y"}}}, "unknown key 'cmd'"),
        ({"servers": {"a": {"command": "x", "args": "-y pkg"}}}, "args must be a list of text"),
        ({"servers": {"a": {"command": "x", "env": {"A B": "1"}}}}, "env must be a table of NAME"),
        ({"servers": {"a": {"command": "x", "env": {"A": 1}}}}, "env must be a table of NAME"),
        ({"servers": {"a": {"url": "ftp://x"}}}, "url must be an http:// or https:// URL"),
        ({"servers": {"a": {"url": "http://x", "args": ["1"]}}}, "args and env go with command"),
        ({"servers": {"a": {"command": "x", "enabled": "yes"}}}, "enabled must be true or false"),
        ({"servers": {"a b": {"command": "x"}}}, "a server's name is 1 to 64 letters"),
        ({"servers": {"a": "npx"}}, "[mcp.servers.a] must be a table"),
        ({"rounds": 0}, "mcp.rounds must be a whole number from 1 to 100"),
        ({"timeout": "soon"}, "mcp.timeout (seconds) must be a number from 1 to 3600"),
        ({"round": 3}, "unknown key 'round'"),
    ],
)
def test_each_bad_value_is_refused_in_one_line_that_says_what_to_write(table, fragment):
    from dflash_chat.mcp_config import read_table

    _, problems = read_table(table)
    assert len(problems) == 1 and "\n" not in problems[0]
    with pytest.raises(SettingsError) as refused:
        settings.parse_value("mcp", table)
    assert fragment in str(refused.value)


def test_set_edits_one_value_in_place_and_keeps_every_other_byte(home, capsys):
    path = write(USER_FILE)
    assert cli.main(["--set", "mcp.servers.files.enabled=false"]) == 0
    after = USER_FILE.replace('env = { NOTES = "1" }\n', 'env = { NOTES = "1" }\nenabled = false\n')
    assert path.read_text() == after
    assert "mcp.servers.files.enabled=false" in capsys.readouterr().out
    assert cli.main(["--set", "mcp.rounds=6"]) == 0
    after = after.replace("rounds = 4          # fewer rounds", "rounds = 6          # fewer rounds")
    assert path.read_text() == after  # the broken entry the app skips is left as the user wrote it
    assert cli.main(["--set", "mcp.servers.files.env.TOKEN_FILE=/run/token", "--set", "mcp.timeout=30"]) == 0
    read = settings.read()[0].mcp
    assert read.servers["files"].env == {"NOTES": "1", "TOKEN_FILE": "/run/token"} and read.timeout == 30
    assert "# fewer rounds" in path.read_text() and "[mcp.servers.broken]" in path.read_text()


def test_set_adds_and_removes_a_server(home):
    path = write("temperature = 0.5\n")
    assert cli.main(["--set", "mcp.servers.git.command=uvx", "--set", "mcp.servers.git.args=mcp-server-git -r ."]) == 0
    assert path.read_text() == (
        'temperature = 0.5\n\n[mcp.servers.git]\ncommand = "uvx"\nargs = ["mcp-server-git", "-r", "."]\n'
    )
    assert cli.main(["--set", 'mcp.servers.git.args=["--repository", "my repo"]']) == 0
    assert settings.read()[0].mcp.servers["git"].args == ("--repository", "my repo")
    assert cli.main(["--set", "mcp.servers.git="]) == 0
    assert path.read_text().rstrip() == "temperature = 0.5"  # (tomlkit leaves the blank line it added)


@pytest.mark.parametrize(
    "assignment, fragment",
    [
        ("mcp.servers.x.enabled=false", '[mcp.servers.x] needs command = "..."'),
        ("mcp.servers.x.cmd=npx", "a server's keys are command, args, env.VAR, url and enabled"),
        ("mcp.rounds=many", "must be a whole number from 1 to 100"),
        ("mcp.servers.x.url=localhost:3000", "url must be an http:// or https:// URL"),
        ("mcp.servers=", "the mcp settings are mcp.rounds=N"),
        ("mcp.servers.x.args=[1", 'args must be a list like ["-y", "pkg"]'),
    ],
)
def test_set_refuses_a_bad_mcp_value_in_one_line_and_keeps_the_file(home, capsys, assignment, fragment):
    path = write(USER_FILE)
    assert cli.main(["--set", assignment]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and err.startswith("dflash-chat: --set mcp")
    assert path.read_text() == USER_FILE


def test_the_settings_screens_saves_leave_mcp_alone(home):
    path = write(USER_FILE)
    current = settings.read()[0]
    from dataclasses import replace

    settings.update(settings.changes(current, replace(current, top_k=5)))
    assert path.read_text() == USER_FILE.replace("# mine\n", "# mine\ntop_k = 5\n")


def test_defaults_need_no_table():
    assert settings.Settings().mcp == McpSettings() and McpSettings().enabled == {}
