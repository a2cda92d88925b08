"""A remote answer against a server that misbehaves (tests/chat/misbehaving.py): whatever text arrived
is kept; an answer without a proper finish is cut, with the reason in one plain sentence; nothing of
Python's own wording reaches the user; stalls are reported in bounded time."""

from __future__ import annotations

import threading
import time

import pytest

from dflash_chat.chat.backends.base import AnswerRequest
from dflash_chat.chat.backends.remote import HttpBackend
from dflash_chat.chat.events import AnswerEnded
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.runtime.bridge import StreamChunk
from dflash_chat.runtime.endpoint import Endpoint
from dflash_chat.runtime.events import ModelLoaded, ModelUnavailable

from .misbehaving import LAST_CHUNK, Misbehaving, Reply, chunk, chunked_head, delta, head, sse, whole

PYTHON = ("Error:", "Traceback", "object has no attribute", "Expecting value", "Errno", "httpx", "Exception")


class Run:
    """A backend whose workers run on plain threads; its events are collected."""

    def __init__(self, url: str, **timeouts) -> None:
        self.events: list[object] = []
        self.backend = HttpBackend(Endpoint.of(url), **timeouts)
        self.threads: list[threading.Thread] = []
        self.backend.attach(self.events.append, self._spawn)

    def _spawn(self, body, group) -> None:
        thread = threading.Thread(target=body, daemon=True)
        self.threads.append(thread)
        thread.start()

    def wait(self, kind, timeout: float = 20.0):  # generous: CI runs two test workers on two cores
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events if isinstance(e, kind)]
            if found:
                return found[-1]
            time.sleep(0.01)
        raise AssertionError(f"no {kind.__name__} within {timeout} s: {self.events}")

    def connect(self):
        self.backend.begin()
        event = self.wait((ModelLoaded, ModelUnavailable))
        self.backend.handle(event)
        return event

    def answer(self, timeout: float = 5.0):
        sampling = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=32)
        request = AnswerRequest(None, [{"role": "user", "content": "hi"}], False, sampling, threading.Event())
        self.backend.answer(request)
        return self.wait(AnswerEnded, timeout).end


def plain(sentence: str) -> None:
    assert sentence and "\n" not in sentence
    for python in PYTHON:
        assert python not in sentence, sentence


def answered(*parts) -> Misbehaving:
    server = Misbehaving()
    server.replies["/v1/chat/completions"] = Reply(*parts)
    return server


HELLO = sse(delta("Hello"), delta(" there"))


@pytest.mark.parametrize(
    "parts, words",
    [
        ((chunked_head(), chunk(HELLO)), "connection to 127.0.0.1"),  # dropped mid-stream
        (
            (chunked_head(), chunk(HELLO + b"data: [1, 2]\n\n"), chunk(sse(delta("!"))), LAST_CHUNK),
            "not an OpenAI stream chunk after 2 tokens",
        ),  # valid JSON, wrong shape
        ((chunked_head(), chunk(HELLO + b"data: {not json\n\n"), LAST_CHUNK), "not an OpenAI stream chunk"),
        ((head(), HELLO), "ended without a finish"),  # closed cleanly, but no [DONE] or finish_reason
        (
            (head(), HELLO + sse({"error": {"message": "engine\nfell over"}})),
            "the server failed after 2 tokens: engine fell over",
        ),
    ],
)
def test_text_that_arrived_is_kept_and_the_answer_is_cut_with_why(parts, words):
    with answered(*parts) as server:
        run = Run(server.url)
        assert isinstance(run.connect(), ModelLoaded)
        end = run.answer()
    assert end.answer == "Hello there" and end.reason == "cut", end
    assert words in end.error
    plain(end.error)
    shown = "".join(e.answer for e in run.events if isinstance(e, StreamChunk))
    assert shown == "Hello there"  # what was on screen stays: the end repeats it, never erases it


def test_a_proper_finish_is_complete_with_or_without_done():
    for parts in ((head(), HELLO + sse(delta("", "stop"))), (head(), HELLO + sse(b"[DONE]"))):
        with answered(*parts) as server:
            run = Run(server.url)
            run.connect()
            end = run.answer()
        assert end.reason == "stop" and end.answer == "Hello there" and end.error is None


@pytest.mark.parametrize(
    "parts, words",
    [
        (
            (whole(200, "text/html", b"<html><body>Welcome to nginx</body></html>"),),
            "did not answer with an OpenAI stream (it sent text/html)",
        ),
        (
            (whole(500, "application/json", b'{"error": {"message": "CUDA out of memory"}}'),),
            "HTTP 500 from the server at 127.0.0.1",
        ),
        ((whole(502, "text/html", b"<html>Bad gateway</html>"),), "HTTP 502 from the server"),
        ((whole(200, "application/json", b"[1, 2]"),), "did not answer with an OpenAI completion"),
    ],
)
def test_a_reply_that_is_no_stream_is_one_plain_sentence(parts, words):
    with answered(*parts) as server:
        run = Run(server.url)
        run.connect()
        end = run.answer()
    assert end.reason == "error" and words in end.error and end.answer == ""
    plain(end.error)
    if "500" in words:
        assert end.error.endswith(": CUDA out of memory")


def test_a_whole_json_completion_is_taken_as_the_answer():
    body = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]}'
    with answered(whole(200, "application/json", body)) as server:
        run = Run(server.url)
        run.connect()
        end = run.answer()
    assert end.reason == "stop" and end.answer == "Hi"


def test_a_stall_mid_answer_is_reported_in_bounded_time():
    with answered(chunked_head(), chunk(HELLO), None) as server:
        run = Run(server.url, stall_s=0.5)
        run.connect()
        started = time.monotonic()
        end = run.answer()
    assert time.monotonic() - started < 3
    assert end.reason == "cut" and end.answer == "Hello there" and "sent nothing for 0.5 s after 2 tokens" in end.error
    plain(end.error)


@pytest.mark.parametrize(
    "reply, words",
    [
        (Reply(None), "did not answer GET /v1/models within 0.5 s"),
        (Reply(whole(200, "text/html", b"<!doctype html><p>router login</p>")), "is not an OpenAI-compatible server"),
        (Reply(whole(200, "application/json", b'{"data": [["x"]]}')), "lists models without an id"),
        (Reply(whole(200, "application/json", b'{"data": []}')), "serves no model yet"),
        (Reply(whole(503, "text/html", b"<html>busy</html>")), "HTTP 503 from the server at"),
    ],
)
def test_a_server_that_is_not_right_is_said_plainly_at_connect(reply, words):
    with Misbehaving() as server:
        server.replies["/v1/models"] = reply
        run = Run(server.url, models_s=0.5)
        started = time.monotonic()
        event = run.connect()
    assert isinstance(event, ModelUnavailable) and words in event.error and time.monotonic() - started < 3
    plain(event.error)


def test_a_server_that_is_not_there_is_said_plainly():
    with Misbehaving() as server:
        url = server.url
    run = Run(url)
    event = run.connect()
    assert (
        isinstance(event, ModelUnavailable) and "cannot reach" in event.error and "is the server running" in event.error
    )
    plain(event.error)


def test_closing_returns_every_waiting_worker_at_once_and_posts_nothing_more():
    with Misbehaving() as server:
        server.replies["/v1/models"] = Reply(None)  # stalls
        run = Run(server.url)  # the default timeouts: seconds, not the test's
        run.backend.begin()
        time.sleep(0.2)
        started = time.monotonic()
        run.backend.close()
        for thread in run.threads:
            thread.join(2)
        assert all(not t.is_alive() for t in run.threads) and time.monotonic() - started < 1
        assert run.events == []
