"""A one-line progress display on stderr for loading a model: bytes placed, rate, time left."""

from __future__ import annotations

import sys
import time

from dflash_chat.sizes import rate_text, size_text


def progress_line(done: int, total: int, seconds: float) -> str:
    """'1.2 GB / 16.5 GB · 1.1 GB/s · 14 s left': bytes placed, their rate, the time left at that rate."""
    rate = done / max(seconds, 1e-9)
    left = f" · {max(total - done, 0) / rate:.0f} s left" if rate > 0 and done < total else ""
    return f"{size_text(done)} / {size_text(total)} · {rate_text(rate)}{left}"


class LoadProgress:
    """Call with (bytes placed, bytes in all); redraws at most ten times a second, only on a terminal."""

    def __init__(self, what: str, stream=None):
        self.what = what
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.started = time.perf_counter()
        self.drawn = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if not self.live or (now - self.drawn < 0.1 and done < total):
            return
        self.drawn = now
        self.stream.write(f"\rloading {self.what}: {progress_line(done, total, now - self.started)}\x1b[K")
        self.stream.flush()

    def summary(self, total: int) -> str:
        seconds = time.perf_counter() - self.started
        return f"loaded {self.what}: {size_text(total)} in {seconds:.1f} s ({rate_text(total / max(seconds, 1e-9))})"

    def close(self, total: int) -> None:
        if self.live:
            self.stream.write("\r" + self.summary(total) + "\x1b[K\n")
            self.stream.flush()
