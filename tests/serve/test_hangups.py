"""Clients that hang up, on each API route: mid-stream the answer is cancelled at once, mid-body the request
is dropped; either way serve stays up, answers the next request, and prints no traceback."""

from __future__ import annotations

import socket

import pytest

from dflash_chat.runtime.endpoint import httpx_module

from .conftest import Answers, Paced, request, serving

QUESTION = "Show the function `dedent` from module `textwrap`."
ROUTES = {
    "chat.completions": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 300, "stream": True},
    ),
    "messages": (
        "/v1/messages",
        {"model": "any", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 300, "stream": True},
    ),
    "responses": ("/v1/responses", {"input": QUESTION, "max_output_tokens": 300, "stream": True}),
}
SHORT = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/messages": {"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_client_gone_mid_stream_cancels_its_answer_and_serve_goes_on(demo_pair, monkeypatch, capfd, route):
    path, body = ROUTES[route]
    httpx = httpx_module()
    paced = Paced(demo_pair, monkeypatch)
    answers = Answers(demo_pair, monkeypatch)
    with serving(demo_pair) as (served, url), httpx.Client(timeout=30) as client:
        with client.stream("POST", url + path, json=body) as response:
            assert response.status_code == 200
            paced.wait_step()  # mid-answer: one step done, the next held
        assert served.scheduler.wait_idle(30), "the dropped answer was never cancelled"
        paced.go.set()
        assert client.post(url + path, json=SHORT[path]).status_code == 200
    assert answers[0].reason == "cancelled" and answers[0].steps_after_cancel <= 1, answers[0]
    assert answers[1].reason != "cancelled"
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out, printed.err


@pytest.mark.parametrize("path", sorted(SHORT))
def test_a_client_gone_mid_body_is_dropped_and_serve_goes_on(demo_pair, capfd, caplog, path):
    httpx = httpx_module()
    with caplog.at_level("WARNING", logger="dflash_chat.serve"), serving(demo_pair, body_timeout_s=5) as (_, url):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(request(path, host=host, body=b'{"messages": [{"role": "user", "con', length=400))
        with httpx.Client(timeout=30) as client:
            assert client.post(url + path, json=SHORT[path]).status_code == 200
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out, printed.err
    logged = [r.getMessage() for r in caplog.records if r.name == "dflash_chat.serve"]
    assert len(logged) == 1 and logged[0].startswith(f"499 POST {path}: the client hung up"), logged


def test_a_responses_stream_the_client_left_is_kept_for_its_id(demo_pair):
    """A Responses stream cut short by its client is kept as far as it was written, as the chat keeps an answer
    cut short: a later request continues from its id (previous_response_id) with that text as the answer."""
    import json

    httpx = httpx_module()
    path, body = ROUTES["responses"]
    with serving(demo_pair) as (served, url), httpx.Client(timeout=60) as client:
        with client.stream("POST", url + path, json=body) as response:
            written, response_id = "", None
            for line in response.iter_lines():
                event = json.loads(line[len("data: ") :]) if line.startswith("data: ") else {}
                if event.get("type") == "response.created":
                    response_id = event["response"]["id"]
                written += event.get("delta", "") if event.get("type") == "response.output_text.delta" else ""
                if written.strip():
                    break
        assert served.scheduler.wait_idle(30)
        kept = served.recall(response_id)
        assert kept is not None and kept[-1]["role"] == "assistant" and kept[-1]["content"].startswith(written)
        more = {"input": "And then?", "previous_response_id": response_id, "max_output_tokens": 16}
        reply = client.post(url + path, json=more)
        assert reply.status_code == 200, reply.text
