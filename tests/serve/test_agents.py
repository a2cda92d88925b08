"""The coding agents people run, driven for real against `serve --demo`: Claude Code (Anthropic Messages),
Codex CLI (Responses) and opencode (chat completions), each one-shot with its default settings and an
isolated HOME, and each once through `dflash-chat launch`. Each must exit 0 with the model's text, and serve
must log no refusal (4xx) or failure (5xx) for their requests. Each also sends an image the way its one-shot mode
attaches one (`codex exec -i`, `opencode run -f`, Claude Code's stream-json input), which the demo's vision tower
shows to the model.

The agents are the pinned npm packages tools/test.sh installs into a cache folder when npm is present
(DFLASH_CHAT_AGENTS_BIN names their bin folder; without it, the cache folder tools/test.sh uses); without them
these tests skip, saying why.

What makes them deterministic: the tiny demo pair, far past its training length under an agent's 8-16k-token
system prompt and tools, loops ("the number of the number of ...") at any temperature, greedy included, and
Claude Code and Codex take an answer cut at its length as an error. So the server these tests drive answers
greedily, with thinking off, and ends each answer at the end of its first line of text (`brief_answers`: the
answering session's sampling and stop strings, set for the test, server-side). Every answer then ends as a
finished turn, the same way on every run. The agents' own settings stay their defaults (no limits written).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from dflash_chat.runtime.stops import StopStrings

from .conftest import serving

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dflash-chat-test-agents"
BIN = Path(os.environ.get("DFLASH_CHAT_AGENTS_BIN") or CACHE / "node_modules" / ".bin")
CONTEXT = 65536  # Claude Code's system prompt and tools alone are ~16k tokens
KEY = "sk-agents"
TASK = "Say hello in one short sentence."
TIMEOUT_S = 300
INSTALL_WAIT_S = 330  # tools/test.sh's npm install is cut at 300 s

pytestmark = [
    pytest.mark.slow(seconds=150),
    pytest.mark.agents,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed: the agents are node programs"),
]


def agent(name: str) -> str:
    _installed()
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in {BIN} (tools/test.sh installs the pinned agents when npm is present)")
    return str(path)


def _installed() -> None:
    """Wait for tools/test.sh's install of the agents when it runs beside the tests (DFLASH_CHAT_AGENTS_STATUS: the
    file it writes when the install ends)."""
    status = os.environ.get("DFLASH_CHAT_AGENTS_STATUS")
    deadline = time.monotonic() + INSTALL_WAIT_S
    while status and not Path(status).exists() and time.monotonic() < deadline:
        time.sleep(0.5)


class FirstLine(StopStrings):
    """The request's stop strings, and the end of the first line that holds some text."""

    def __init__(self, stops) -> None:
        super().__init__([s for s in stops if s != "\n"])
        self.said = False

    def feed(self, text: str) -> str:
        out = super().feed(text)
        for at, char in enumerate(out):
            if char == "\n" and self.said:
                self.matched, self._held = True, ""  # `which` stays None: the turn ended, no stop sequence
                return out[:at]
            self.said = self.said or not char.isspace()
        return out


@pytest.fixture
def brief_answers(monkeypatch):
    """Every answer serve gives in this process greedy, thinking off, ended after its first line of text; yields
    the answers' texts."""
    from dflash_chat.runtime import session
    from dflash_chat.serve import served

    answer, continuing_prompt = session.EngineSession.answer, served.continuing_prompt
    texts: list[str] = []

    def brief(self, prompt, params, *args, **kwargs):
        params = dataclasses.replace(params, temperature=0.0, stop=(*params.stop, "\n"))
        end = answer(self, prompt, params, *args, **kwargs)
        texts.append(end.answer)
        return end

    def unthinking(tokenizer, turns, *, thinking, **kwargs):
        return continuing_prompt(tokenizer, turns, thinking=False, **kwargs)

    monkeypatch.setattr(session, "StopStrings", FirstLine)
    monkeypatch.setattr(session.EngineSession, "answer", brief)
    monkeypatch.setattr(served, "continuing_prompt", unthinking)
    return texts


def said(out: str, answers: list[str]) -> bool:
    """Whether the agent printed one of the model's answers."""
    return any(text.strip() and text.strip() in out for text in answers)


@pytest.fixture(scope="module")
def long_pair():
    """The demo pair at an agent's context, with its (random) vision tower: the agents' images reach the prompt."""
    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_paths, demo_vision

    return load_pair(*demo_paths(), device="cpu", max_context=CONTEXT, vision=demo_vision())


@pytest.fixture(scope="module")
def server(long_pair):
    with serving(long_pair, api_key=KEY) as running:
        yield running


@pytest.fixture
def refusals():
    """serve's refusals and failures during the test: its log's warnings and errors (one per 4xx/5xx), taken
    from its logger itself (launch's log file may have stopped it passing records on)."""
    handler = _Kept(logging.WARNING)
    logger = logging.getLogger("dflash_chat.serve")
    logger.addHandler(handler)
    yield lambda: [r.getMessage() for r in handler.records]
    logger.removeHandler(handler)


class _Kept(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def isolated(tmp_path: Path, **env: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    names = ("PATH", "LANG", "TERM", "SYSTEMROOT", "TMPDIR")
    keep = {k: v for k, v in os.environ.items() if k in names}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1", **env}


def run_agent(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


def test_codex_exec_output_schema_gets_json_valid_for_it(server, tmp_path, refusals, brief_answers):
    """`codex exec --output-schema FILE` sends the schema as Responses' `text.format`: the demo's answer, held to
    it, is JSON valid for it, and codex prints it as the last message."""
    import jsonschema

    served, url = server
    schema = {
        "type": "object",
        "properties": {"greeting": {"type": "string", "maxLength": 40}, "friendly": {"type": "boolean"}},
        "required": ["greeting", "friendly"],
        "additionalProperties": False,
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    provider = f'{{name="dflash-chat", base_url="{url}/v1", env_key="DFC_KEY", wire_api="responses"}}'
    config = ["-c", "model_provider=dfc", "-c", f"model_providers.dfc={provider}", "-c", f'model="{served.name}"']
    last = tmp_path / "last.txt"
    argv = [agent("codex"), *config, "exec", "--skip-git-repo-check", "--output-schema", str(path)]
    run_agent([*argv, "--output-last-message", str(last), TASK], isolated(tmp_path, DFC_KEY=KEY), tmp_path)
    jsonschema.validate(json.loads(last.read_text()), schema)
    assert refusals() == []


@pytest.fixture
def shown_images(monkeypatch):
    """How many images each answer's prompt showed the model, answer by answer."""
    from dflash_chat.runtime import session

    answer, counts = session.EngineSession.answer, []

    def counted(self, prompt, *args, **kwargs):
        counts.append(len(prompt.images))
        return answer(self, prompt, *args, **kwargs)

    monkeypatch.setattr(session.EngineSession, "answer", counted)
    return counts


def screenshot(path: Path) -> Path:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (320, 200), "white")
    ImageDraw.Draw(image).rectangle((80, 50, 240, 150), fill=(200, 30, 30))
    image.save(path)
    return path


def test_codex_speaks_responses_and_sends_an_image(server, tmp_path, refusals, brief_answers, shown_images):
    """`codex exec -i shot.png`: codex talks to serve in Responses (one run for the text and the image: each agent
    run is most of a minute of the suite), the image goes as an `input_image` data URL, and the demo's tower shows
    it to the model (random weights: the answer says nothing true of it)."""
    served, url = server
    assert served.session is not None and served.session.vision is not None  # the demo ships its tower
    provider = f'{{name="dflash-chat", base_url="{url}/v1", env_key="DFC_KEY", wire_api="responses"}}'
    config = ["-c", "model_provider=dfc", "-c", f"model_providers.dfc={provider}", "-c", f'model="{served.name}"']
    shot = screenshot(tmp_path / "shot.png")
    argv = [agent("codex"), *config, "exec", "--skip-git-repo-check", TASK, "-i", str(shot)]
    out = run_agent(argv, isolated(tmp_path, DFC_KEY=KEY), tmp_path)
    assert said(out, brief_answers)
    assert shown_images and shown_images[0] == 1
    assert refusals() == []


def test_claude_code_sends_an_image_block(server, tmp_path, refusals, brief_answers, shown_images):
    """Claude Code one-shot with an image: `-p --input-format stream-json` takes the user's message as Anthropic
    content blocks on stdin (its one-shot mode's way to attach one), and serve gets the `image` block. (Its plain
    `claude -p TASK` runs in test_launch_runs_each_agent_on_the_demo: each agent run is most of a minute.)"""
    import base64

    served, url = server
    assert served.session is not None and served.session.vision is not None  # the demo ships its tower
    data = base64.b64encode(screenshot(tmp_path / "shot.png").read_bytes()).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    content = [{"type": "text", "text": "What is in this picture?"}, image]
    message = {"type": "user", "message": {"role": "user", "content": content}}
    env = isolated(tmp_path, ANTHROPIC_BASE_URL=url, ANTHROPIC_AUTH_TOKEN=KEY, ANTHROPIC_MODEL=served.name)
    argv = [agent("claude"), "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
    done = subprocess.run(
        argv, env=env, cwd=tmp_path, input=json.dumps(message) + "\n", capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    results = [event for event in events if event.get("type") == "result"]
    assert results and said(results[-1].get("result", ""), brief_answers), done.stdout[-3000:]
    assert 1 in shown_images
    assert refusals() == []


def test_opencode_speaks_chat_completions_and_sends_an_image(server, tmp_path, refusals, brief_answers, shown_images):
    """`opencode run -f shot.png`: opencode talks to serve in chat completions (text and image in one run), the
    image as an `image_url` data URL."""
    served, url = server
    assert served.session is not None and served.session.vision is not None  # the demo ships its tower
    provider = {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": f"{url}/v1", "apiKey": KEY}}
    provider["models"] = {
        served.name: {
            "name": served.name,
            "attachment": True,
            "modalities": {"input": ["text", "image"], "output": ["text"]},
        }
    }
    (tmp_path / "opencode.json").write_text(json.dumps({"provider": {"dfc": provider}}))
    shot = screenshot(tmp_path / "shot.png")
    argv = [agent("opencode"), "run", "-m", f"dfc/{served.name}", "-f", str(shot), "--", TASK]
    out = run_agent(argv, isolated(tmp_path), tmp_path)
    assert said(out, brief_answers)
    assert shown_images and shown_images[0] == 1
    assert refusals() == []


@pytest.fixture
def serve_log():
    """launch sends serve's log to a file (and off the logger's parents): put the logger back afterwards."""
    logger = logging.getLogger("dflash_chat.serve")
    saved = logger.handlers[:], logger.propagate, logger.level
    yield
    for handler in logger.handlers:
        if handler not in saved[0]:
            handler.close()
    logger.handlers, logger.propagate = saved[0], saved[1]
    logger.setLevel(saved[2])


# each agent takes 10-35 s on two cores: the suite runs every agent one-shot and launches Claude Code (the one
# that needs the most: a 64k context); DFLASH_CHAT_AGENTS_ALL=1 launches the other two as well
ALL = os.environ.get("DFLASH_CHAT_AGENTS_ALL") == "1"
ONLY_WITH_ALL = pytest.mark.skipif(not ALL, reason="launched only with DFLASH_CHAT_AGENTS_ALL=1 (the suite's time)")


@pytest.mark.parametrize(
    "name, args",
    [
        ("claude", ["-p", TASK]),
        pytest.param("codex", ["exec", "--skip-git-repo-check", TASK], marks=ONLY_WITH_ALL),
        pytest.param("opencode", ["run", TASK], marks=ONLY_WITH_ALL),
    ],
)
def test_launch_runs_each_agent_on_the_demo(tmp_path, monkeypatch, capfd, brief_answers, serve_log, name, args):
    """`dflash-chat launch NAME --demo -- ARGS`, in this process (so the answers are brief as above): it serves,
    runs the agent with its own settings pointed there, and stops serve when the agent exits."""
    from dflash_chat import cli

    binary = Path(agent(name))
    for key, value in isolated(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "dfc"))
    monkeypatch.chdir(tmp_path)
    code = cli.main(["launch", name, "--demo", "--", *args])
    out, err = capfd.readouterr()
    assert code == 0, (out + err)[-3000:]
    assert said(out, brief_answers)
    log = (tmp_path / "dfc" / "data" / "launch-serve.log").read_text()
    assert not re.search(r"serve: [45]\d\d ", log), log  # no refusal (4xx) and no failure (5xx) in serve's log
    assert re.search(r"serve: \S+: \d+ prompt tokens", log), log  # serve's own log: a line per answer
    assert "unrecognized_model" not in out + err  # Claude Code's note about the model goes to that log
