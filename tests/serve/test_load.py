"""Load on one engine: concurrent streams queue and all answer right, overflow is 429, a client that
leaves frees the engine within one step, and hundreds of requests leave memory flat."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from dflash_chat.chat.backends.remote import httpx_module
from dflash_chat.runtime.memory import memory_use

from .conftest import Answers, Paced, serving, wait_until

QUESTIONS = [
    "What does the with statement do?",
    "What is a generator expression?",
    "How do I sort a list of tuples by the second item?",
    "Write a function that reads a JSON file.",
    "Show the class definition of OrderedDict.",
    "Show the function that joins path components in posixpath.",
    "How do I open a file?",
    "What is a context manager?",
]
TOKENS = 8


def body(question: str, stream: bool, tokens: int = TOKENS) -> dict:
    return {
        "model": "dflash-chat-demo",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    }


def streamed_text(client, url: str, question: str) -> str:
    text = []
    with client.stream("POST", f"{url}/v1/chat/completions", json=body(question, True)) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:") and not line.endswith("[DONE]"):
                for choice in json.loads(line[5:])["choices"]:
                    text.append(choice["delta"].get("content") or "")
    return "".join(text)


def test_eight_concurrent_streams_each_get_their_solo_answer(demo_pair):
    httpx = httpx_module()
    with serving(demo_pair, max_waiting=8) as (served, url), httpx.Client(timeout=120) as client:
        solo = [
            client.post(f"{url}/v1/chat/completions", json=body(q, False)).json()["choices"][0]["message"]["content"]
            for q in QUESTIONS
        ]
        results: dict[int, str] = {}
        errors: list[BaseException] = []
        start = threading.Barrier(len(QUESTIONS))

        def one(i: int) -> None:
            try:
                start.wait(timeout=30)
                results[i] = streamed_text(client, url, QUESTIONS[i])
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(QUESTIONS))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        assert [results[i] for i in range(len(QUESTIONS))] == solo
        assert all(solo)
        assert served.scheduler.wait_idle(30)


def test_overflow_is_429_and_a_client_that_leaves_frees_the_engine_within_one_step(demo_pair, monkeypatch):
    httpx = httpx_module()
    paced = Paced(demo_pair, monkeypatch)
    answers = Answers(demo_pair, monkeypatch)
    with serving(demo_pair, max_waiting=0) as (served, url), httpx.Client(timeout=60) as client:
        long = client.stream("POST", f"{url}/v1/chat/completions", json=body(QUESTIONS[0], True, tokens=400))
        response = long.__enter__()
        assert response.status_code == 200
        paced.wait_step()  # the prefill's token: the answer runs, and waits for the test
        busy = client.post(f"{url}/v1/chat/completions", json=body(QUESTIONS[1], False))
        assert busy.status_code == 429
        assert int(busy.headers["retry-after"]) >= 1
        error = busy.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error"
        paced.go.set()  # the answer runs freely now
        paced.wait_step()
        long.__exit__(None, None, None)  # the client goes away mid-stream
        assert served.scheduler.wait_idle(30), "the engine did not stop"
        record = answers[-1]
        assert record.reason == "cancelled" and record.new_tokens < 400
        assert record.steps_after_cancel <= 1
        # ... and the engine is free for the next client
        after = client.post(f"{url}/v1/chat/completions", json=body(QUESTIONS[1], False))
        assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"]


@pytest.mark.slow(seconds=25)
def test_two_hundred_requests_in_a_row_leave_memory_flat(demo_pair):
    httpx = httpx_module()
    with serving(demo_pair) as (served, url), httpx.Client(timeout=60) as client:

        def ask(i: int) -> None:
            message = f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"
            response = client.post(f"{url}/v1/chat/completions", json=body(message, i % 2 == 0, tokens=2))
            assert response.status_code == 200

        for i in range(20):  # warm up: allocators and caches reach their working size
            ask(i)
        before = memory_use("cpu").used_bytes
        for i in range(200):
            ask(i)
        after = memory_use("cpu").used_bytes
        assert served.metrics.success.labels(*served.metrics.labels, "length")._value.get() == 220
    assert after < before * 1.05, f"RSS grew from {before} to {after} bytes"


def send_raw(url: str, payload: dict) -> socket.socket:
    """A POST written on a bare socket: closing the socket is the client leaving, at once."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(payload).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_that_waits_in_the_queue_and_leaves_is_never_run(demo_pair, monkeypatch, stream):
    httpx = httpx_module()
    paced = Paced(demo_pair, monkeypatch)
    answers = Answers(demo_pair, monkeypatch)
    with serving(demo_pair, max_waiting=2) as (served, url), httpx.Client(timeout=60) as client:
        first = client.stream("POST", f"{url}/v1/chat/completions", json=body(QUESTIONS[0], True, tokens=400))
        first.__enter__()
        paced.wait_step()
        waiting = send_raw(url, body(QUESTIONS[1], stream, tokens=400))
        wait_until(lambda: served.scheduler.waiting == 1, 30, "the request to wait")
        waiting.close()  # it leaves while it waits
        first.__exit__(None, None, None)
        assert served.scheduler.wait_idle(30)
        assert len(answers) == 1  # only the first answer ran


def test_clients_share_one_draft_memory_per_kind_of_text(demo_pair, monkeypatch):
    memories = []
    real = demo_pair.engine.generate

    def generate(prompt_ids, params, cancel=None, *, memory=None, **keys):
        memories.append(memory)
        return real(prompt_ids, params, cancel, memory=memory, **keys)

    monkeypatch.setattr(demo_pair.engine, "generate", generate)
    httpx = httpx_module()
    with serving(demo_pair) as (served, url), httpx.Client(timeout=60) as client:
        for question, thinking in ((QUESTIONS[0], False), (QUESTIONS[1], False), (QUESTIONS[0], True)):
            payload = {**body(question, False, tokens=2), "chat_template_kwargs": {"enable_thinking": thinking}}
            assert client.post(f"{url}/v1/chat/completions", json=payload).status_code == 200
        raw = {"model": "dflash-chat-demo", "prompt": "def add(a, b):", "max_tokens": 2, "temperature": 0}
        assert client.post(f"{url}/v1/completions", json=raw).status_code == 200
    off, other_client, on, completion = memories
    assert off is other_client  # two clients, one memory: no conversation is named in the API
    assert len({id(off), id(on), id(completion)}) == 3
    assert all(m.records is served.service.records for m in memories)  # they start from one drafter's records
    assert not hasattr(demo_pair.engine, "acceptance")  # the engine keeps none of it
