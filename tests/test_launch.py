"""`dflash-chat launch`: the agent's settings point at the local server and leave the user's own untouched;
a missing agent, or arguments after -- for another command, are one line that says what to do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dflash_chat import cli
from dflash_chat.commands.launch import KEY_ENV, agent_command, check_arguments

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


def test_codex_exec_outside_a_git_repository_says_what_to_do_before_serve_loads(tmp_path):
    """Codex's exec refuses to run outside a git repository; launch says so, and the fix, in one line, before it
    loads anything (the fake codex on PATH is never run)."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    work.mkdir()
    fake = bin_dir / "codex"
    fake.write_text("#!/bin/sh\necho ran > ran.txt\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DFLASH_CHAT_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "dflash_chat.cli", "launch", "codex", "--demo", "--", "exec", "hi"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "not in one" in done.stderr and "--skip-git-repo-check" in done.stderr
    assert not (work / "ran.txt").exists()
    check_arguments("codex", ["exec", "--skip-git-repo-check", "hi"], work)  # told: it passes
    (work / ".git").mkdir()
    check_arguments("codex", ["exec", "hi"], work / "sub")  # inside a repository: it passes
    check_arguments("claude", ["-p", "hi"], tmp_path)  # another agent: nothing to check


AGENT = """
import pathlib, signal, sys, time
here = pathlib.Path(sys.argv[1])
def save(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(1.0)  # an agent saving its session on Ctrl-C
    (here / "saved").write_text("yes")
    sys.exit(3)
signal.signal(signal.SIGINT, save)
sys.stderr.write("[claude-code:unrecognized_model] {\\"model\\": \\"dflash-chat-demo\\"}\\n")
sys.stderr.write("a line the user must see\\n")
sys.stderr.flush()
(here / "ready").write_text("yes")
time.sleep(60)
"""
DRIVER = """
import logging, os, pathlib, sys
from dflash_chat.commands import launch
here = pathlib.Path(sys.argv[1])
launch._log_to(here / "launch-serve.log")
sys.exit(launch.run_agent([sys.executable, str(here / "agent.py"), str(here)], dict(os.environ), quiet=launch.QUIET["claude"]))
"""


@pytest.mark.parametrize("to_group", [True, False], ids=["from-the-terminal", "to-launch-alone"])
def test_ctrl_c_is_the_agents_and_its_notes_about_the_model_go_to_the_log(tmp_path, to_group):
    """Ctrl-C is the agent's: sent to the process group as a terminal sends it (or to launch alone, which passes it
    on), the agent finishes saving (1 s, past the 0.25 s subprocess.run gave it) and launch exits with the agent's
    status; Claude Code's note that the model is not in its catalog goes to launch-serve.log, every other stderr
    line to the screen."""
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "driver.py").write_text(DRIVER)
    driver = subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and driver.poll() is None, driver.stderr.read()
        time.sleep(0.05)
    if to_group:
        os.killpg(driver.pid, signal.SIGINT)
    else:
        os.kill(driver.pid, signal.SIGINT)
    assert driver.wait(timeout=30) == 3
    err = driver.stderr.read()
    assert (tmp_path / "saved").read_text() == "yes"
    assert "a line the user must see" in err and "unrecognized_model" not in err and "Traceback" not in err
    assert "[claude-code:unrecognized_model]" in (tmp_path / "launch-serve.log").read_text()
