"""The values a person hands the engine, each with one range and one error text.

The settings file and `--set`, a command's flags and a request body in `serve` all read these values
through the rules here, so they take the same values and refuse a bad one in the same words ("must be a
number from 0 to 2, got 3"); each place only says which name it read (`temperature`, `--temperature`,
`'temperature'`). No torch: the settings and the flags are checked before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Invalid(ValueError):
    """What is wrong with a value, worded without its name: 'must be a number from 0 to 2, got 3'."""


def shown(value: Any, limit: int = 40) -> str:
    """A value as an error quotes it: a whole float as its integer (3.0 given as "3" and as 3 reads alike),
    text cut at `limit` characters, anything else by its kind (a list, say)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "…"
    return repr(value) if isinstance(value, bool) or value is None else type(value).__name__


@dataclass(frozen=True)
class Number:
    """A number within [low, high] (or (low, high] with `open_low`); `off` is a value below `low` that also
    means "no limit", read as `low` (top-k's -1, as vLLM takes it)."""

    kind: type  # int or float
    low: float
    high: float
    open_low: bool = False
    off: int | None = None
    note: str = ""  # what the value means, after the range: "0 = off"

    @property
    def what(self) -> str:
        kind = "a whole number" if self.kind is int else "a number"
        low = f"{self.off} or {shown(self.low)}" if self.off is not None else shown(self.low)
        span = (
            f"greater than {low} and at most {shown(self.high)}"
            if self.open_low
            else f"from {low} to {shown(self.high)}"
        )
        return f"{kind} {span}" + (f" ({self.note})" if self.note else "")

    def check(self, value: Any) -> Any:
        """A typed value (TOML, JSON): a number in range, nothing else."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._refuse(value)
        if self.kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise self._refuse(value)
            value = int(value)
        if self.off is not None and value == self.off:
            return self.kind(self.low)
        if value != value or value < self.low or value > self.high or (self.open_low and value == self.low):
            raise self._refuse(value)
        return self.kind(value)

    def parse(self, value: Any) -> Any:
        """A value that may be text (a flag, `--set`, the settings form): the text is read as a number first."""
        if isinstance(value, str):
            text = value.strip()
            try:
                value = int(text) if self.kind is int else float(text)
            except ValueError:
                try:
                    value = float(text)  # "5.0" for a whole number: check() takes it, "5.5" it refuses
                except ValueError:
                    raise self._refuse(value) from None
        return self.check(value)

    def _refuse(self, value: Any) -> Invalid:
        return Invalid(f"must be {self.what}, got {shown(value)}")


TEMPERATURE = Number(float, 0.0, 2.0, note="0 = greedy")
TOP_P = Number(float, 0.0, 1.0, open_low=True, note="1 = off")
TOP_K = Number(int, 0, 2**31 - 1, off=-1, note="0 = off")
MIN_P = Number(float, 0.0, 1.0, note="0 = off")
MAX_NEW_TOKENS = Number(int, 1, 1_000_000)
SEED = Number(int, 0, 2**63 - 1)
PREFIX_CACHE_MIB = Number(int, 0, 1_048_576, note="0 = off")  # MiB of prompt checkpoints (engine/prefix_cache.py)
PREFIX_CACHE_MIB_DEFAULT = 1024
PREFIX_CACHE_RAM_MIB = Number(int, 0, 16_777_216, note="0 = off")  # MiB of parked conversations (engine/parked.py)
PREFIX_CACHE_RAM_MIB_DEFAULT = 4096

MAX_DRAFT = 64
DRAFT_WORDS = ("auto", "off")
DRAFT_WHAT = f"auto, off or a number of drafts per step (1-{MAX_DRAFT})"


def draft(value: Any) -> str | int:
    """The draft setting: 'auto', 'off', or a number of drafts per step (kept a number, as `draft = 7` reads)."""
    if isinstance(value, str) and value.strip().lower() in DRAFT_WORDS:
        return value.strip().lower()
    try:
        return Number(int, 1, MAX_DRAFT).parse(value)
    except Invalid:
        raise Invalid(f"must be {DRAFT_WHAT}, got {shown(value)}") from None


def fit_draft(value: str | int, most: int) -> tuple[str | int, str]:
    """A draft setting fitted to the pair that runs it: a number above `most` (the most drafts a verify step of
    this pair takes: a DFlash drafter's block - 1, else the most its other methods draft) is lowered to `most`,
    and the note says so, in the words the flags, the settings file and serve share. The limit is known only
    once the pair is loaded, so this runs there (engine/load.py) and where the setting changes after
    (runtime/session.py); before that, rules.draft checks only 1-MAX_DRAFT."""
    if isinstance(value, str) or value <= most or most < 1:
        return value, ""
    return most, f"draft {value} is more drafts per step than this model pair makes (at most {most}); drafting {most}"


SPECULATE_WORDS = ("auto", "dflash", "mtp", "lookup", "none")
SPECULATE_WHAT = "auto, dflash, mtp, lookup or none"


def speculate(value: Any) -> str:
    """The speculate setting: which method drafts, 'auto' choosing per step, 'none' for plain decoding."""
    if isinstance(value, str) and value.strip().lower() in SPECULATE_WORDS:
        return value.strip().lower()
    raise Invalid(f"must be {SPECULATE_WHAT}, got {shown(value)}")


def switch(value: Any) -> bool:
    """A switch: true or false (TOML), or typed as on/off, true/false, yes/no, 1/0."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "on", "yes", "1"):
            return True
        if lowered in ("false", "off", "no", "0"):
            return False
    raise Invalid(f"must be on or off (true/false), got {value!r}")


VISION_WORDS = ("auto", "off")
VISION_WHAT = "auto (the vision tower loads where it fits beside the model) or off"


def vision(value: Any) -> str:
    """The vision setting: 'auto' loads the model's vision tower where memory allows, 'off' never loads it."""
    if isinstance(value, str) and value.strip().lower() in VISION_WORDS:
        return value.strip().lower()
    raise Invalid(f"must be {VISION_WHAT}, got {shown(value)}")
