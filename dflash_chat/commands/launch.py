"""`dflash-chat launch claude|codex|opencode [MODEL FLAGS] [-- ARGS]`: a coding agent on the local engine.

As `ollama launch` does: serve starts on a free loopback port with a fresh random key (the model flags as
for `serve`), and once the model is ready the agent runs with its settings pointed there, ARGS passed on;
when the agent exits, serve stops. The agent's own configuration is never edited: Claude Code reads its
environment, Codex takes `-c` overrides, opencode an extra config file in a temporary folder. The
context is raised to what the agent needs (Claude Code's system prompt and tools alone are ~16k tokens),
and the agent is told the model's window where it takes one. serve's log goes to a file, not onto the
agent's screen. Ctrl-C is the agent's to handle: launch serves it until it ends.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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
# the agents' own notes that are about us, not for the user's screen: Claude Code's, that the model is not one of
# its catalog's (it is not a Claude model; launch tells it the context, which is what the note is about)
QUIET = {"claude": ("[claude-code:unrecognized_model]",)}


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
    check_arguments(args.agent, args.passthrough, Path.cwd())
    if args.context is None or args.context < agent.context:
        args.context = max(args.context or 0, agent.context)
    settings, _ = settings_module.read()
    settings, request = model_request(args, settings)
    with serving(settings, request, args.max_tokens) as (url, key, name, context), tempfile.TemporaryDirectory() as tmp:
        argv, env = agent_command(args.agent, binary, url, key, name, context, Path(tmp))
        quiet = QUIET.get(args.agent, ())
        return run_agent([*argv, *args.passthrough], {**os.environ, **env}, quiet=quiet)


def check_arguments(agent: str, passthrough: list[str], cwd: Path) -> None:
    """What the agent would refuse before doing anything, said before serve loads: `codex exec` works only inside a
    git repository (Codex's own guard) unless told --skip-git-repo-check."""
    if agent != "codex" or passthrough[:1] != ["exec"] or "--skip-git-repo-check" in passthrough:
        return
    if not any((folder / ".git").exists() for folder in (cwd, *cwd.parents)):
        raise UserError(
            f"codex exec runs only inside a git repository, and {cwd} is not in one: cd into one, or add "
            "--skip-git-repo-check after exec (dflash-chat launch codex -- exec --skip-git-repo-check ...)"
        )


def run_agent(argv: list[str], env: dict[str, str], *, quiet: tuple[str, ...] = ()) -> int:
    """Run the agent to its end; its exit status. Ctrl-C is the agent's: the terminal sends it to the agent as it
    sends it to us, and the agent decides what it means (save its session and leave; or, as Claude Code does,
    cancel only the answer it is writing), so launch goes on waiting, and serving it, until it ends.
    `quiet`: the starts of the agent's stderr lines that go to serve's log instead of the screen."""
    process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE if quiet else None)
    relay = _relay(process.stderr, quiet) if quiet else None
    try:
        while True:
            try:
                return process.wait()
            except KeyboardInterrupt:
                if not _terminal_reaches_agent():
                    process.send_signal(signal.SIGINT)  # a Ctrl-C sent to launch alone: the agent's all the same
    finally:
        if relay is not None:
            relay.join(timeout=5)


def _terminal_reaches_agent() -> bool:
    """Whether a Ctrl-C typed reaches the agent from the terminal itself: launch, and the agent in its process
    group, are the terminal's foreground job."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, AttributeError, ValueError):
        return False


def _relay(stream, quiet: tuple[str, ...]) -> threading.Thread:
    """The agent's stderr passed on to ours as it comes, but for the lines starting with one of `quiet`, which go
    to serve's log (where launch-serve.log has them)."""
    log = logging.getLogger("dflash_chat.serve")

    def relay() -> None:
        with stream:
            for line in iter(stream.readline, b""):
                if line.startswith(tuple(q.encode() for q in quiet)):
                    log.info("the agent said: %s", line.decode(errors="replace").strip())
                    continue
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()

    thread = threading.Thread(target=relay, name="dflash-launch-stderr", daemon=True)
    thread.start()
    return thread


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
        context = self.served.session.context
        logging.getLogger("dflash_chat.serve").info(
            "serving %s on %s/v1 for the agent (context %d tokens)", self.served.name, self.running.url, context
        )
        return self.running.url, key, self.served.name, context

    def __exit__(self, *exc) -> None:
        self.running.stop()
        logging.getLogger("dflash_chat.serve").info("stopped: the agent has ended")


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
    logger.setLevel(logging.DEBUG)  # each answer's line too (serve's terminal shows only refusals and failures)
    logger.propagate = False
    return path
