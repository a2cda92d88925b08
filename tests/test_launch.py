"""`dflash-chat launch`: the agent's settings point at the local server and leave the user's own untouched;
a missing agent, or arguments after -- for another command, are one line that says what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dflash_chat import cli
from dflash_chat.commands.launch import KEY_ENV, agent_command

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

URL, KEY, NAME, CONTEXT = "http://127.0.0.1:4567", "k3y", "dflash-chat-demo", 65536


def test_claude_code_is_pointed_by_its_environment(tmp_path):
    argv, env = agent_command("claude", "/bin/claude", URL, KEY, NAME, CONTEXT, tmp_path)
    assert argv == ["/bin/claude"] and env["ANTHROPIC_BASE_URL"] == URL and env["ANTHROPIC_AUTH_TOKEN"] == KEY
    assert env["ANTHROPIC_API_KEY"] == ""  # the user's own key must not win over the local one
    assert {env[k] for k in env if k.endswith("_MODEL")} == {NAME}  # every size Claude Code asks for is ours
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(CONTEXT) and list(tmp_path.iterdir()) == []


def test_codex_takes_overrides_that_parse_as_its_toml(tmp_path):
    argv, env = agent_command("codex", "/bin/codex", URL, KEY, NAME, CONTEXT, tmp_path)
    assert argv[0] == "/bin/codex" and env == {KEY_ENV: KEY}
    pairs = dict(argv[i + 1].split("=", 1) for i in range(1, len(argv), 2))
    assert all(argv[i] == "-c" for i in range(1, len(argv), 2))
    provider = tomllib.loads("p = " + pairs["model_providers.dflash-chat"])["p"]
    assert provider == {"name": "dflash-chat", "base_url": f"{URL}/v1", "env_key": KEY_ENV, "wire_api": "responses"}
    assert tomllib.loads("m = " + pairs["model"])["m"] == NAME and pairs["model_provider"] == "dflash-chat"
    assert int(pairs["model_context_window"]) == CONTEXT


def test_opencode_gets_an_extra_config_file_of_its_own(tmp_path):
    argv, env = agent_command("opencode", "/bin/opencode", URL, KEY, NAME, CONTEXT, tmp_path)
    config = json.loads(open(env["OPENCODE_CONFIG"]).read())
    provider = config["provider"]["dflash-chat"]
    assert argv == ["/bin/opencode"] and config["model"] == f"dflash-chat/{NAME}"
    assert provider["options"] == {"baseURL": f"{URL}/v1", "apiKey": KEY}
    assert provider["models"][NAME]["limit"]["context"] == CONTEXT
    assert env["OPENCODE_CONFIG"].startswith(str(tmp_path))  # a temporary folder, not the user's config


def test_a_missing_agent_names_the_package_to_install(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "DFLASH_CHAT_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "dflash_chat.cli", "launch", "codex", "--demo", "--", "exec", "hi"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "npm install -g @openai/codex" in done.stderr


def test_arguments_after_a_double_dash_go_only_to_launch(capsys):
    assert cli.main(["models", "--", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "arguments after -- go only to `launch`" in err
