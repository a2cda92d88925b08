"""Stop strings (the OpenAI `stop` parameter) on streamed text: the answer ends before the first one.

Text that might be the start of a stop string is held back until the next piece says whether it is,
so nothing after (or of) a stop string is ever emitted.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.matched = False
        self.which: str | None = None  # the stop string that ended the text (the earliest in it)
        self._held = ""

    def feed(self, text: str) -> str:
        """The text that can be emitted now; after a match, nothing more."""
        if self.matched:
            return ""
        text = self._held + text
        found = [(at, s) for s in self.stops if (at := text.find(s)) >= 0]
        if found:
            cut, self.which = min(found, key=lambda pair: pair[0])
            self.matched, self._held = True, ""
            return text[:cut]
        keep = max((_partial_suffix(text, s) for s in self.stops), default=0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back as a possible start of a stop string that never came."""
        held, self._held = self._held, ""
        return "" if self.matched else held


def _partial_suffix(text: str, stop: str) -> int:
    """Length of the longest end of `text` that is a proper start of `stop`."""
    for size in range(min(len(stop) - 1, len(text)), 0, -1):
        if stop.startswith(text[-size:]):
            return size
    return 0
