"""Streaming detokenization: token ids in, new text out, never half a character.

Byte-level BPE can split one character over several tokens; decoding a window
of recent tokens and emitting only what grew (and does not end in U+FFFD) is
the usual cure, and keeps each step's work small.
"""

from __future__ import annotations


class IncrementalDecoder:
    def __init__(self, tokenizer, skip_ids: tuple[int, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.skip_ids = set(skip_ids)
        self.ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # end of the text already emitted

    def push(self, token_ids: list[int]) -> str:
        self.ids.extend(t for t in token_ids if t not in self.skip_ids)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return after[len(before) :]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False) if ids else ""
