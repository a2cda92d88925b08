"""Servers on loopback ports the OS picks, in this process, around the real engine and the demo pair.

Every server is stopped when its test ends; tests wait on conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, replace

import pytest

from dflash_chat.models.demo import demo_available
from dflash_chat.settings import Settings
from tests.pacing import after_each_step

pytestmark = pytest.mark.skipif(not demo_available(), reason="the demo pair is not in dflash_chat/demo_data")

GREEDY = Settings(temperature=0.0, top_p=1.0, top_k=0, context_length=1024)
CONTEXT = 1024


@pytest.fixture(scope="session")
def demo_pair():
    if not demo_available():
        pytest.skip("the demo pair is not in dflash_chat/demo_data")
    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_paths

    return load_pair(*demo_paths(), device="cpu", max_context=CONTEXT)


@contextlib.contextmanager
def serving(pair, **rules):
    """A server for `pair` (a fresh engine session on it) on a loopback port; yields (served, url)."""
    from dflash_chat.runtime.session import EngineSession
    from dflash_chat.serve.served import Served
    from dflash_chat.serve.server import Running

    served = Served("dflash-chat-demo", replace(GREEDY, **rules.pop("settings", {})), **rules)
    if pair is not None:
        served.ready(EngineSession(pair))
    with Running(served) as running:
        yield served, running.url


def wait_until(condition, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Paced:
    """The pair's engine one step at a time: after each decode step it waits until the test lets the
    next one run, or the answer is cancelled. A test acting mid-answer then never misses that state."""

    def __init__(self, pair, monkeypatch) -> None:
        self.steps = threading.Semaphore(0)  # one release per finished step
        self.go = threading.Event()
        monkeypatch.setattr(pair.engine, "generate", after_each_step(pair.engine.generate, self._hold))

    def _hold(self, cancel) -> None:
        self.steps.release()
        while not self.go.is_set() and not (cancel is not None and cancel.is_set()):
            self.go.wait(0.01)

    def wait_step(self, timeout: float = 60.0) -> None:
        assert self.steps.acquire(timeout=timeout), "no engine step came"

    def forget(self) -> None:
        """Drop the steps counted so far (an earlier answer's), so that `wait_step` waits for the next one's."""
        self.steps = threading.Semaphore(0)


@dataclass
class Answered:
    """One answer the engine finished: how it ended, and the decode steps it ran after its cancel was set."""

    reason: str
    new_tokens: int
    steps: int
    steps_after_cancel: int
    stats: object = None


class Answers(list):
    """Every answer the pair's engine finishes from now on, in order (an Answered each): what the tests
    read of how cancelling went. Made after a Paced, it sees the steps as the server does."""

    def __init__(self, pair, monkeypatch) -> None:
        super().__init__()
        from dflash_chat.engine.events import Finished, Step

        real = pair.engine.generate

        def generate(prompt_ids, params, cancel=None, **keys):
            after_cancel = 0
            for event in real(prompt_ids, params, cancel, **keys):
                if isinstance(event, Step) and cancel is not None and cancel.is_set():
                    after_cancel += 1
                if isinstance(event, Finished):
                    stats = event.stats
                    self.append(Answered(event.reason, stats.new_tokens, stats.steps, after_cancel, stats))
                yield event

        monkeypatch.setattr(pair.engine, "generate", generate)


def request(
    path: str = "/v1/chat/completions",
    *,
    host: str = "127.0.0.1",
    kind: str = "application/json",
    body: bytes = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
    length: int | None = None,
    extra: str = "",
) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n{extra}\r\n"
    )
    return head.encode() + body
