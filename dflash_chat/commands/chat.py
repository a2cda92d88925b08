"""The bare `dflash-chat` command: opens the chat app (flags here are the top-level ones).

Which model runs is decided in runtime/model_source.py: --demo, --target/--drafter files, the
model-choice flags, the `model` setting, or (nothing named) the best pair for this machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dflash_chat import paths
from dflash_chat import settings as settings_module
from dflash_chat.models import hardware

MODEL_SETTING_HELP = (
    "model is a pair name from `dflash-chat models` or a path: a value that exists as a file or folder, "
    "or is written like a path (with a /, or starting with ~ or .), is a model folder or GGUF, loaded "
    "with the drafter setting; anything else must be a known pair name; empty lets the app choose"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "chat (no subcommand)",
        "With no model named, the app picks the pair and quants that fit this machine and downloads "
        "what is missing (the tiny demo model without a GPU). DFLASH_CHAT_DEVICE=cpu loads on the CPU.",
    )
    group.add_argument("--demo", action="store_true", help="chat with the tiny built-in demo model pair")
    group.add_argument(
        "--target", metavar="PATH", help="target model: a folder (config.json, safetensors, tokenizer) or a GGUF file"
    )
    group.add_argument("--drafter", metavar="PATH", help="DFlash drafter folder or GGUF for --target")
    group.add_argument(
        "--draft",
        type=settings_module.flag("draft"),
        metavar="auto|off|N",
        help="drafts each decode step verifies, for this session (the draft setting: auto picks per "
        "step by speed, off decodes plainly, N drafts N tokens)",
    )
    group.add_argument(
        "--speculate",
        type=settings_module.flag("speculate"),
        metavar="auto|dflash|mtp|lookup|none",
        help="which method drafts, for this session (the speculate setting: auto chooses per step among "
        "the drafter, the model's own MTP layer and prompt lookup)",
    )
    group.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="assignments",
        help="save a setting to config.toml and exit (repeatable), e.g. --set temperature=0.2; "
        f"keys: {', '.join(settings_module.KEYS)}. {MODEL_SETTING_HELP}",
    )
    group.add_argument(
        "--data-dir", metavar="DIR", type=Path, help="keep the chat history in DIR instead of the default data folder"
    )
    group.add_argument(
        "--endpoint",
        metavar="URL|NAME",
        help="chat with an OpenAI-compatible server instead of a local model (dflash-chat serve, "
        "vLLM, SGLang, llama.cpp's server): its URL, e.g. http://127.0.0.1:8000/v1, or the "
        "name of one in the endpoints setting",
    )
    group.add_argument(
        "--api-key",
        help="API key for --endpoint (or set DFLASH_CHAT_API_KEY; a named endpoint NAME also reads DFLASH_CHAT_API_KEY_NAME)",
    )
    hardware.add_choice_arguments(parser)


def main(args: argparse.Namespace) -> int:
    if args.assignments:
        return save_assignments(args.assignments)
    current, problems = settings_module.read()  # what cannot be used is shown in the app, never rewritten
    build_app(args, current, problems).run()
    return 0


def build_app(args: argparse.Namespace, current: settings_module.Settings, problems: Sequence[str] = ()):
    from dataclasses import replace

    from dflash_chat.runtime.model_source import pick_from_args, resolve
    from dflash_chat.ui.app import DFlashChatApp

    history = (args.data_dir / paths.history_db().name) if args.data_dir else None
    if getattr(args, "draft", None) is not None:
        current = replace(current, draft=args.draft)  # this session's; config.toml keeps its own
    if getattr(args, "speculate", None) is not None:
        current = replace(current, speculate=args.speculate)
    if getattr(args, "vision", None) is not None:
        current = replace(current, vision=args.vision)
    if getattr(args, "endpoint", None):
        return DFlashChatApp(current, endpoint(args, current), history_path=history, problems=problems)
    if getattr(args, "api_key", None):
        from dflash_chat.errors import UserError

        raise UserError("--api-key goes with --endpoint (the key of that server)")
    source = resolve(current, target=args.target, drafter=args.drafter, demo=args.demo, pick=pick_from_args(args))
    return DFlashChatApp(current, source, history_path=history, problems=problems)


def endpoint(args: argparse.Namespace, current: settings_module.Settings):
    """--endpoint: a URL, or a name from the endpoints setting; the model flags do not go with it."""
    from dflash_chat.errors import UserError
    from dflash_chat.runtime.endpoint import Endpoint, api_key
    from dflash_chat.runtime.model_source import pick_from_args

    local = [
        flag
        for flag, given in (
            ("--demo", args.demo),
            ("--target", args.target),
            ("--drafter", args.drafter),
            ("--draft", getattr(args, "draft", None) is not None),
            ("--speculate", getattr(args, "speculate", None) is not None),
            ("--vision", getattr(args, "vision", None) is not None),
            ("--mmproj", getattr(args, "mmproj_file", None) is not None),
        )
        if given
    ] + (["--model/--quant/--*-file"] if pick_from_args(args).pins_files else [])
    if local:
        raise UserError(f"--endpoint chats with a server's model: leave out {', '.join(local)}")
    name = args.endpoint if args.endpoint in current.endpoints else ""
    url = current.endpoints.get(args.endpoint, args.endpoint)
    return Endpoint.of(url, api_key(args.api_key, name, os.environ), name)


def save_assignments(assignments: list[str]) -> int:
    """--set: validate every assignment, then change exactly those keys in config.toml (nothing else in it)."""
    from dflash_chat.runtime.model_source import drafter_value, model_value

    current, _ = settings_module.read()
    changes: dict = {}
    said: dict[str, str] = {}  # how each change is said back: its value, or the assignments to [mcp]
    for text in assignments:
        key, value = settings_module.parse_assignment(
            text,
            keymap=changes.get("keymap", current.keymap),
            endpoints=changes.get("endpoints", current.endpoints),
            mcp=changes.get("mcp", current.mcp),
        )
        if key == "model":
            value = model_value(value)
        elif key == "drafter":
            value = drafter_value(value)
        elif key == "theme":
            check_theme(value)
        elif key == "keymap":
            check_keymap(value)
        changes[key] = value
        said[key] = f"{key} = {value!r}" if key != "mcp" else "; ".join(filter(None, (said.get(key), text.strip())))
    path = settings_module.update(changes)
    for line in said.values():
        print(line)
    print(f"saved to {path}")
    for problem in settings_module.read(path)[1]:  # what else in the file the app cannot use
        print(f"note: {problem}", file=sys.stderr)
    return 0


def check_theme(name: str) -> None:
    """A theme name must be one the app can show: shipped, Textual's own, or a theme file that loads."""
    from textual.theme import BUILTIN_THEMES

    from dflash_chat.ui.themes import discover_themes

    found = discover_themes()
    if name in found.names | set(BUILTIN_THEMES):
        return
    if name in found.broken:
        raise settings_module.SettingsError(f"theme {name!r} cannot be used: {found.broken[name]}")
    ours = ", ".join(t.name for t in found.themes)
    raise settings_module.SettingsError(
        f"theme must be one of {ours} (or Textual's: {', '.join(sorted(BUILTIN_THEMES))}), or the name of "
        f"a theme file in {paths.user_themes_dir()}; got {name!r}"
    )


def check_keymap(overrides: dict[str, str]) -> None:
    from dflash_chat.ui import keymap

    problems = keymap.resolve(overrides).problems
    if problems:
        raise settings_module.SettingsError(problems[0])
