"""One answer at a time on the engine: the rest wait in a bounded queue, in order of arrival.

A GPU running one model answers fastest one request at a time (the engine keeps one sequence: no
batching). Requests past the bound are refused at once (the app answers 429 with a Retry-After from
how long answers take here); a request whose client left while it waited is dropped unrun.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class QueueFull(Exception):
    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"{waiting} requests are waiting already")
        self.retry_after = retry_after


@dataclass
class Job:
    work: Callable[["Job"], None]  # runs on the engine thread
    cancel: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None


class Scheduler:
    def __init__(self, max_waiting: int, on_change: Callable[[int, int], None] = lambda running, waiting: None):
        self.max_waiting = max_waiting
        self.on_change = on_change  # (running, waiting) after every change: the Prometheus gauges
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._lock = threading.Condition()
        self._closed = False
        self._answer_s = 2.0  # a running mean of answer times, for Retry-After
        self._thread = threading.Thread(target=self._loop, name="dflash-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            busy = self._running is not None or bool(self._waiting)
            if busy and len(self._waiting) >= self.max_waiting + (self._running is None):
                ahead = len(self._waiting) + (self._running is not None)
                raise QueueFull(len(self._waiting), max(1, math.ceil(ahead * self._answer_s)))
            self._waiting.append(job)
            self._lock.notify()
            self._changed()

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def _changed(self) -> None:
        self.on_change(int(self._running is not None), len(self._waiting))

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                job = self._waiting.popleft()
                if job.cancel.is_set():  # its client left while it waited
                    self._changed()
                    continue
                self._running = job
                self._changed()
            job.started_at = time.monotonic()
            try:
                job.work(job)
            finally:
                took = time.monotonic() - job.started_at
                with self._lock:
                    self._running = None
                    self._answer_s = 0.8 * self._answer_s + 0.2 * took
                    self._changed()
                    self._lock.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Until nothing runs or waits (tests, shutdown); False if that did not happen in time."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._running is not None or self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self) -> None:
        """Stop taking work: the running answer is cancelled, the waiting ones dropped."""
        with self._lock:
            self._closed = True
            for job in self._waiting:
                job.cancel.set()
            self._waiting.clear()
            if self._running is not None:
                self._running.cancel.set()
            self._lock.notify_all()
        self._thread.join(timeout=30)
