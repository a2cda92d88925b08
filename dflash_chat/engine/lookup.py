"""Prompt lookup: drafts copied from the context itself, no model (vLLM's `ngram`, llama.cpp's lookup).

The text so far (the prompt and the answer, as token ids) is searched for an earlier occurrence of its own
end: the longest suffix (up to MAX_MATCH tokens, at least MIN_MATCH) that occurred before, the most recent
occurrence among equals. The tokens that followed that occurrence are the proposal (where the match
covers its own distance to the end, the text repeats, and so does the proposal). Agentic and editing
work copies whole runs of its context (a file it edits, a block it repeats), which this drafts for free and
far ahead.

Occurrences are found through a hash of each position's last MIN_MATCH tokens (their positions, newest
last); a query compares the suffix backwards against the newest CANDIDATES occurrences of its last
MIN_MATCH tokens. Adding a token costs one dict update, a query at most CANDIDATES * MAX_MATCH compares, so
it runs every step on the host while the device verifies nothing. A deterministic proposal is a one-hot q:
the exact acceptance rule (sampling.py) keeps the output distributed as the target's at T > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_MATCH = 2  # tokens a match must cover
MAX_MATCH = 32  # tokens a match is measured over (a longer one counts as this)
CANDIDATES = 8  # newest occurrences of the last MIN_MATCH tokens a query compares


@dataclass(slots=True)  # made every step: a frozen dataclass's __init__ costs microseconds there (events.Step)
class Match:
    tokens: list[int]  # what followed the occurrence: the proposal
    length: int  # tokens of the text's end the occurrence matched (MIN_MATCH .. MAX_MATCH)


class PromptLookup:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # last MIN_MATCH tokens -> positions they end at

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            if end + 1 >= MIN_MATCH:
                self._ends.setdefault(tuple(self.tokens[end + 1 - MIN_MATCH :]), []).append(end)

    def truncate(self, length: int) -> None:
        """Forget the tokens from `length` on (the engine rolled its state back to a shorter prefix)."""
        while len(self.tokens) > length:
            end = len(self.tokens) - 1
            if end + 1 >= MIN_MATCH:
                key = tuple(self.tokens[end + 1 - MIN_MATCH :])
                ends = self._ends[key]
                ends.pop()
                if not ends:
                    del self._ends[key]
            self.tokens.pop()

    def propose(self, most: int) -> Match | None:
        """Up to `most` tokens that followed the longest earlier match of the text's end; None without one."""
        end = len(self.tokens) - 1
        if end + 1 < MIN_MATCH or most < 1:
            return None
        ends = self._ends.get(tuple(self.tokens[end + 1 - MIN_MATCH :]), [])
        best, best_length = -1, 0
        for candidate in reversed(ends[-CANDIDATES - 1 :]):
            if candidate == end:  # the text's own end
                continue
            length = self._matched(candidate, end)
            if length > best_length:
                best, best_length = candidate, length
                if length == MAX_MATCH:  # no older occurrence can match longer
                    break
        if best < 0:
            return None
        proposal = self.tokens[best + 1 : best + 1 + most]
        if proposal and min(proposal) < 0:  # an image's tokens are held as negative keys (engine/images.py)
            proposal = proposal[: next(i for i, token in enumerate(proposal) if token < 0)]  # never drafted
        elif len(proposal) < most and best_length >= end - best:  # the match covers its own period: a loop
            _repeat(proposal, end - best, most)
        return Match(proposal, best_length) if proposal else None

    def _matched(self, candidate: int, end: int) -> int:
        """Tokens (up to MAX_MATCH) ending at `candidate` that equal those ending at `end` (candidate < end). Found by
        halving over slices compared whole (a run of n that matches holds every shorter one): a query runs every step,
        and a token-by-token loop over a repetitive text's many long matches cost tens of microseconds a step."""
        tokens, matched, most = self.tokens, 0, min(MAX_MATCH, candidate + 1)
        while matched < most:
            n = (matched + most + 1) // 2
            if tokens[candidate - n + 1 : candidate + 1] == tokens[end - n + 1 : end + 1]:
                matched = n
            else:
                most = n - 1
        return matched


def _repeat(proposal: list[int], period: int, most: int) -> None:
    """The text's end matched an occurrence `period` tokens before it over at least `period` tokens: it repeats with
    that period, so the proposal goes on copying itself (as LZ77 copies an overlapping match) up to `most` tokens.
    A model caught in a loop of a few tokens is drafted far ahead, not `period` tokens a step."""
    while len(proposal) < most:
        proposal.append(proposal[len(proposal) - period])
