"""`dflash-chat launch claude|codex|opencode [MODEL FLAGS] [-- ARGS]`: a coding agent on the local engine.

As `ollama launch` does: serve starts on a free loopback port with a fresh random key (the model flags as
for `serve`), and once the model is ready the agent runs with its settings pointed there, ARGS passed on;
when the agent exits, serve stops. The agent's own configuration is never edited: Claude Code reads its
environment, Codex takes `-c` overrides, opencode an extra config file in a temporary folder. The
context is raised to what the agent needs (Claude Code's system prompt and tools alone are ~16k tokens),
and the agent is told the model's window where it takes one. serve's log goes to a file, not onto the
agent's screen.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dflash_chat.commands.serve import add_model_arguments, model_request
from dflash_chat.errors import UserError


@dataclass(frozen=True)
class Agent:
    command: str
    package: str  # what `npm install -g` takes
    context: int  # the context the agent needs at least


AGENTS = {
    "claude": Agent("claude", "@anthropic-ai/claude-code", 65536),
    "codex": Agent("codex", "@openai/codex", 32768),
    "opencode": Agent("opencode", "opencode-ai", 32768),
}
KEY_ENV = "DFLASH_CHAT_LAUNCH_KEY"  # the variable Codex reads the key from


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "launch",
        help="run a coding agent (Claude Code, Codex CLI, opencode) on the local engine",
        description="Start serve on a free loopback port with a fresh key, run the agent against it (ARGS after "
        "-- go to the agent), stop serve when the agent exits. The agent's own configuration is not changed.",
    )
    p.add_argument("agent", choices=sorted(AGENTS), help="the agent to run; arguments after -- go to it")
    add_model_arguments(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from dflash_chat import settings as settings_module

    agent = AGENTS[args.agent]
    binary = shutil.which(agent.command)
    if binary is None:
        raise UserError(
            f"{agent.command} is not installed (or not on PATH): install it with `npm install -g {agent.package}`"
        )
    if args.context is None or args.context < agent.context:
        args.context = max(args.context or 0, agent.context)
    settings, _ = settings_module.read()
    settings, request = model_request(args, settings)
    with serving(settings, request, args.max_tokens) as (url, key, name, context), tempfile.TemporaryDirectory() as tmp:
        argv, env = agent_command(args.agent, binary, url, key, name, context, Path(tmp))
        return subprocess.run([*argv, *args.passthrough], env={**os.environ, **env}).returncode


class serving:
    """serve in this process on a free loopback port, with a fresh key; yields (url, key, model name, context)."""

    def __init__(self, settings, request, max_answer: int | None = None) -> None:
        self.settings, self.request, self.max_answer = settings, request, max_answer

    def __enter__(self):
        from dflash_chat import paths
        from dflash_chat.runtime.model_source import ModelSource
        from dflash_chat.serve.served import Served
        from dflash_chat.serve.server import Running, served_name, start_loading

        self.log = _log_to(paths.data_dir() / "launch-serve.log")
        key = secrets.token_hex(16)
        name = served_name(self.request) if isinstance(self.request, ModelSource) else None
        self.served = Served(name, self.settings, api_key=key, max_answer=self.max_answer)
        self.running = Running(self.served).start()
        loading = start_loading(self.served, self.request, self.settings)
        loading.done.wait()
        if self.served.load_error or self.served.session is None:
            self.running.stop()
            raise UserError(self.served.load_error or "the model did not load")
        print(f"serving {self.served.name} for the agent; its log: {self.log}", file=sys.stderr, flush=True)
        return self.running.url, key, self.served.name, self.served.session.context

    def __exit__(self, *exc) -> None:
        self.running.stop()


def agent_command(agent: str, binary: str, url: str, key: str, name: str, context: int, tmp: Path):
    """(the agent's command line before ARGS, the environment it adds) pointing it at `url`."""
    if agent == "claude":
        return [binary], _claude_env(url, key, name, context)
    if agent == "codex":
        return [binary, *_codex_overrides(url, name, context)], {KEY_ENV: key}
    return [binary], {"OPENCODE_CONFIG": str(_opencode_config(tmp / "opencode.json", url, key, name, context))}


def _claude_env(url: str, key: str, name: str, context: int) -> dict[str, str]:
    """Claude Code reads the Anthropic API from its environment; every model size it asks for is ours."""
    sizes = {f"ANTHROPIC_DEFAULT_{size}_MODEL": name for size in ("HAIKU", "SONNET", "OPUS")}
    return {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_AUTH_TOKEN": key,
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": name,
        "ANTHROPIC_SMALL_FAST_MODEL": name,
        **sizes,
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(context),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def _codex_overrides(url: str, name: str, context: int) -> list[str]:
    """Codex's `-c` overrides: a provider on the Responses API, its key read from KEY_ENV."""
    provider = f'{{name="dflash-chat", base_url="{url}/v1", env_key="{KEY_ENV}", wire_api="responses"}}'
    overrides = ["model_provider=dflash-chat", f"model_providers.dflash-chat={provider}"]
    overrides += [f'model="{name}"', f"model_context_window={context}"]
    return [part for override in overrides for part in ("-c", override)]


def _opencode_config(path: Path, url: str, key: str, name: str, context: int) -> Path:
    """An extra opencode config (OPENCODE_CONFIG, merged over the user's own): an OpenAI-compatible provider."""
    model = {"name": name, "limit": {"context": context, "output": min(8192, context // 4)}}
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "dflash-chat",
        "options": {"baseURL": f"{url}/v1", "apiKey": key},
        "models": {name: model},
    }
    path.write_text(json.dumps({"provider": {"dflash-chat": provider}, "model": f"dflash-chat/{name}"}))
    return path


def _log_to(path: Path) -> Path:
    """serve's one-line log into `path` instead of the terminal the agent draws on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("dflash_chat.serve")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s serve: %(message)s"))
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return path
