"""The one clock of the decode loop: marks on the device's timeline that cost no host wait.

On CUDA a mark is an event recorded on the current stream and an interval can be read once the stream
has passed its end mark (the loop reads each step's intervals after the step's host read, or at the end
of an answer); on the CPU a mark is perf_counter(). `busy` adds up the host seconds spent inside the timed calls
(on the CPU, the calls themselves): what the loop's host time per step leaves out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

Mark = float | torch.cuda.Event  # perf_counter() on the CPU, an event on CUDA


@dataclass
class Interval:
    kind: str  # "verify" (with its accept and commit), or the drafting method of a draft ("dflash", "mtp", "lookup")
    size: int  # tokens verified (for a draft: by the verify it drafts for)
    begin: Mark
    end: Mark


class Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.pending: list[Interval] = []
        self.busy = 0.0  # host seconds inside `timed` calls

    def mark(self) -> Mark:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def timed(self, kind: str, size: int, fn, *args) -> None:
        """Run fn(*args) between two marks; the interval is counted by `ended`."""
        begin = self.mark()
        issued = time.perf_counter() if self.cuda else begin
        fn(*args)
        end = self.mark()
        self.busy += (time.perf_counter() if self.cuda else end) - issued  # type: ignore[operator]
        self.pending.append(Interval(kind, size, begin, end))

    def ended(self, wait: bool = False) -> list[tuple[Interval, float]]:
        """The intervals the device has finished (all of them, waiting, when `wait`) with their seconds."""
        if not self.cuda:  # a CPU interval ended when its call returned
            done = [(it, it.end - it.begin) for it in self.pending]  # type: ignore[operator]
            self.pending = []
            return done
        done, left = [], []
        for it in self.pending:
            if _passed(it.end, wait):
                done.append((it, _seconds(it.begin, it.end)))
            else:
                left.append(it)
        self.pending = left
        return done

    def drop_last_draft(self) -> None:
        """Forget the newest interval if it is a draft (an unused one at the end of an answer)."""
        if self.pending and self.pending[-1].kind != "verify":
            self.pending.pop()


def _passed(end: Mark, wait: bool) -> bool:
    """Whether the device has passed the mark `end` (waiting for it when `wait`); a CPU mark has passed."""
    if not isinstance(end, torch.cuda.Event):
        return True
    if not (wait or end.query()):
        return False
    end.synchronize()
    return True


def _seconds(begin: Mark, end: Mark) -> float:
    if isinstance(begin, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
        return begin.elapsed_time(end) / 1000
    assert isinstance(begin, float) and isinstance(end, float), "both marks come from one clock"
    return end - begin
