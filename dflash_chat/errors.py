"""Turning known failures into one line a user can act on (no tracebacks for bad input)."""

from __future__ import annotations

OUT_OF_MEMORY = "out of memory: use a smaller quant or model, or a shorter context (context_length, --context)"
# how torch words it: CUDA's OutOfMemoryError says "out of memory", the CPU allocator "can't allocate memory"
_OOM_TEXT = ("out of memory", "can't allocate memory")


class UserError(Exception):
    """Raised by commands for problems the user can fix; the message is the whole story."""


def describe(exc: BaseException) -> str | None:
    """One line for errors we expect from users' input or their machine; None for real bugs (let them raise)."""
    from dflash_chat.engine.errors import EngineError

    if isinstance(exc, (UserError, EngineError)):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename}. Check the path."
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}."
    if _out_of_memory(exc):
        return OUT_OF_MEMORY
    return None


def one_line(exc: BaseException, doing: str) -> str:
    """describe(exc), or '<doing> failed (Type: message)' so an unexpected failure can be reported."""
    return describe(exc) or f"{doing} failed ({type(exc).__name__}: {exc})"


def _out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return any(words in text for words in _OOM_TEXT)
