"""The bare `dflash-chat` command: opens the chat app (flags here are the top-level ones)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from dflash_chat import paths
from dflash_chat import settings as settings_module


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("chat (no subcommand)")
    group.add_argument("--demo", action="store_true", help="chat with the tiny built-in demo model pair")
    group.add_argument("--target", metavar="DIR", help="target model directory (config.json, safetensors, tokenizer)")
    group.add_argument("--drafter", metavar="DIR", help="DFlash drafter directory for --target")
    group.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="assignments",
                       help="save a setting to config.toml and exit (repeatable), e.g. --set temperature=0.2; "
                            f"keys: {', '.join(settings_module.KEYS)}")
    group.add_argument("--data-dir", metavar="DIR", type=Path,
                       help="keep the chat history in DIR instead of the default data folder")


def main(args: argparse.Namespace) -> int:
    current = settings_module.load()
    if args.assignments:
        return save_assignments(current, args.assignments)
    build_app(args, current).run()
    return 0


def build_app(args: argparse.Namespace, current: settings_module.Settings):
    from dflash_chat.chat.model_source import resolve
    from dflash_chat.ui.app import DFlashChatApp

    source = resolve(current, target=args.target, drafter=args.drafter, demo=args.demo)
    history = (args.data_dir / paths.history_db().name) if args.data_dir else None
    return DFlashChatApp(current, source, history_path=history)


def save_assignments(current: settings_module.Settings, assignments: list[str]) -> int:
    updated = current
    for text in assignments:
        key, value = settings_module.parse_assignment(text)
        if key in ("model", "drafter") and value:
            value = str(Path(value).expanduser().resolve())  # the app may start from another folder
        updated = replace(updated, **{key: value})
    path = settings_module.save(updated)
    for text in assignments:
        key = text.partition("=")[0].strip()
        print(f"{key} = {getattr(updated, key)!r}")
    print(f"saved to {path}")
    return 0
