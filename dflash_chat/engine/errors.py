"""Errors the engine raises for bad input: each message says what is wrong and what to do."""


class EngineError(Exception):
    """Base class: the message is one line a user can act on."""


class ModelFormatError(EngineError):
    """Model files are missing, corrupt, of an unknown architecture or of the wrong shape."""


class ContextLengthError(EngineError):
    """The prompt plus the requested tokens do not fit the configured context."""


class MissingMethod(EngineError):
    """A drafting method was asked for that the loaded pair does not have (an MTP layer, a DFlash drafter)."""
