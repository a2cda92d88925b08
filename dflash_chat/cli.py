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

SUBCOMMANDS = ("run", "serve", "launch", "bench", "models", "pull", "doctor")
PASSTHROUGH = ("launch",)  # commands that hand the arguments after `--` to a program they run


class Parser(argparse.ArgumentParser):
    """Errors in one line that says where to look, instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


class Commands(argparse._SubParsersAction):
    """The subcommands. The chat's own options (the top-level ones) must not come before a command:
    `dflash-chat --quant X models` would silently drop --quant. And a command reports options it does
    not know itself, under its own usage: `dflash-chat models --target-file F`."""

    def __call__(self, parser, namespace, values, option_string=None):
        name = values[0]
        given = [
            a.option_strings[0]
            for a in parser._actions
            if a.option_strings and a.dest not in ("help", "version") and getattr(namespace, a.dest, None) != a.default
        ]
        if given:
            parser.exit(
                2,
                f"{parser.prog}: {', '.join(given)} before the command `{name}` would be ignored: "
                f"options go after the command they belong to (see `{parser.prog} {name} --help`)\n",
            )
        command = self._name_parser_map.get(name)
        if command is not None:
            own, passthrough = _split_passthrough(values[1:])
            if passthrough and name not in PASSTHROUGH:
                parser.exit(
                    2,
                    f"{parser.prog} {name}: arguments after -- go only to `launch` (see `{parser.prog} {name} --help`)\n",
                )
            command.parse_args(own, namespace)  # errors name the command, not the chat
            namespace.passthrough = passthrough
            setattr(namespace, self.dest, name)
            return
        super().__call__(parser, namespace, values, option_string)  # an unknown command: argparse says so


def _split_passthrough(values: list[str]) -> tuple[list[str], list[str]]:
    """(a command's own arguments, those after the first `--`)."""
    if "--" not in values:
        return values, []
    at = values.index("--")
    return values[:at], values[at + 1 :]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dflash-chat",
        description="Chat with a local Qwen3.6 model, sped up by DFlash speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"dflash-chat {__version__}")
    _command("chat").add_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", action=Commands)
    for name in SUBCOMMANDS:
        _command(name).register(subparsers)
    return parser


def _command(name: str):
    return importlib.import_module(f"dflash_chat.commands.{name}")


def main(argv: list[str] | None = None) -> int:
    interrupted, restore = _watch_ctrl_c()
    try:  # a Ctrl+C while the commands' modules import (the first second) ends as quietly as a later one
        return _main(argv)
    except KeyboardInterrupt:
        print("dflash-chat: interrupted", file=sys.stderr)
        return 130
    except Exception:
        # a Ctrl+C inside a C extension's import (numpy's, under torch's) leaves it half made, and the import
        # after it fails with an ImportError: the Ctrl+C is what the user did
        if not interrupted:
            raise
        print("dflash-chat: interrupted", file=sys.stderr)
        return 130
    finally:
        restore()


def _watch_ctrl_c():
    """(a list that gets an item when SIGINT arrives, which still raises KeyboardInterrupt as Python's own handler
    does; a function that puts the handler before it back). Left alone where SIGINT is not Python's to handle
    (ignored, or set by whoever called main), or off the main thread.

    A Ctrl+C that lands while a module imports is raised once the import is over: thrown inside one, it can
    pass through C++ that cannot carry it (torch.distributed's init: the process aborts, SIGABRT), or be caught
    and lost by a library's `try: import x except: ...` (the command then runs on as if no key was pressed)."""
    import _thread
    import os
    import signal
    import threading

    seen: list[bool] = []
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or before is not signal.default_int_handler:
        return seen, lambda: None
    watching = [True]

    def again():
        if not watching:
            return
        if os.name == "nt":  # os.kill would end the process there
            _thread.interrupt_main(signal.SIGINT)
        else:  # a real signal, which also ends a sleep or a read the main thread is blocked in
            os.kill(os.getpid(), signal.SIGINT)

    def on_sigint(signum, frame):
        seen.append(True)
        if _importing(frame):
            timer = threading.Timer(IMPORT_RETRY_S, again)
            timer.daemon = True
            timer.start()
            return
        raise KeyboardInterrupt

    def restore():
        watching.clear()
        signal.signal(signal.SIGINT, before)

    signal.signal(signal.SIGINT, on_sigint)
    return seen, restore


IMPORT_RETRY_S = 0.02  # how soon a Ctrl+C held back by an import is tried again


def _importing(frame) -> bool:
    """Whether the code at `frame` runs inside an import (importlib's frames are below it)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a flag refused (already said in one line)
        return int(exc.code or 0)
    handler = getattr(args, "handler", None) or _command("chat").main
    from dflash_chat import cpu_threads, paths

    paths.place_torch_caches()
    cpu_threads.place_wait_policy()
    try:
        _check_environment()
        return int(handler(args) or 0)
    except Exception as exc:  # noqa: BLE001 - the one place errors become one line
        from dflash_chat.errors import describe

        message = describe(exc)
        if message is None:
            raise
        print(f"dflash-chat: {message}", file=sys.stderr)
        return 2


def _check_environment() -> None:
    """The variables every command reads are spelled as they must be: $DFLASH_CHAT_DEVICE=tpu is refused,
    not run on the CPU in silence."""
    import os

    from dflash_chat.commands.run import check_device_name
    from dflash_chat.runtime.model_source import DEVICE_ENV

    check_device_name(os.environ.get(DEVICE_ENV), DEVICE_ENV)


if __name__ == "__main__":
    sys.exit(main())
