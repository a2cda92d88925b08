"""Turning known failures into one line a user can act on (no tracebacks for bad input)."""

from __future__ import annotations


class UserError(Exception):
    """Raised by commands for problems the user can fix; the message is the whole story."""


def describe(exc: BaseException) -> str | None:
    """One line for errors we expect from users' input; None for real bugs (let them raise)."""
    from dflash_chat.engine.errors import EngineError

    if isinstance(exc, (UserError, EngineError)):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename}. Check the path."
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}."
    if isinstance(exc, MemoryError):
        return "out of memory. Try a smaller model, a smaller quant or a shorter context."
    return None
