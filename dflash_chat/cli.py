"""`dflash-chat` entry point.

Each subcommand lives in dflash_chat/commands/<name>.py with `register(subparsers)`;
heavy imports (torch, textual) happen inside the command, so `--help` is instant.
The bare command (no subcommand) opens the chat app: see commands/chat.py.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dflash_chat import __version__

SUBCOMMANDS = ("run", "bench", "models", "pull", "doctor")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-chat",
        description="Chat with a local Qwen3.6 model, sped up by DFlash speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"dflash-chat {__version__}")
    _command("chat").add_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        _command(name).register(subparsers)
    return parser


def _command(name: str):
    return importlib.import_module(f"dflash_chat.commands.{name}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None) or _command("chat").main
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("dflash-chat: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place errors become one line
        from dflash_chat.errors import describe

        message = describe(exc)
        if message is None:
            raise
        print(f"dflash-chat: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
