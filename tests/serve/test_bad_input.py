"""Bad requests get the right status and an OpenAI-shaped error, never a traceback; the server goes on."""

from __future__ import annotations

import pytest

from dflash_chat.chat.remote import httpx_module

from .conftest import CONTEXT, serving

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GOOD = {"model": "dflash-chat-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(demo_pair):
    with serving(demo_pair, api_key=KEY, max_body=64 * 1024) as running:
        yield running


def post(url: str, payload=None, *, content: bytes | None = None, headers=AUTH, path="/v1/chat/completions"):
    httpx = httpx_module()
    if content is not None:
        return httpx.post(url + path, content=content, headers={**headers, "Content-Type": "application/json"},
                          timeout=60)
    return httpx.post(url + path, json=payload, headers=headers, timeout=60)


def openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize("content, words", [
    (b'{"model": "dflash-chat-demo", "messages": [', "not valid JSON"),
    (b"[1, 2, 3]", "must be a JSON object"),
    (b"\xff\xfe not text", "not valid JSON"),
])
def test_malformed_json_is_400(server, content, words):
    _, url = server
    error = openai_error(post(url, content=content), 400)
    assert words in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("change, param", [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": 1.5}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": "many"}, "max_completion_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"stop": [1, 2]}, "stop"),
    ({"seed": -1}, "seed"),
    ({"n": 2}, "n"),
    ({"model": 7}, "model"),
    ({"chat_template_kwargs": {"enable_thinking": "sure"}}, "chat_template_kwargs.enable_thinking"),
    ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
])
def test_wrong_types_and_ranges_are_400_naming_the_field(server, change, param):
    _, url = server
    error = openai_error(post(url, {**GOOD, **change}), 400)
    assert error["param"] == param


def test_a_completion_without_a_prompt_is_400(server):
    _, url = server
    error = openai_error(post(url, {"model": "dflash-chat-demo", "prompt": ["a", "b"]}, path="/v1/completions"), 400)
    assert error["param"] == "prompt"


def test_an_unknown_model_is_404(server):
    _, url = server
    error = openai_error(post(url, {**GOOD, "model": "gpt-9"}), 404)
    assert error["code"] == "model_not_found" and "gpt-9" in error["message"] and "dflash-chat-demo" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_400(server, stream):
    _, url = server
    long = " ".join(["with open(path) as handle: text = handle.read()"] * 200)
    error = openai_error(post(url, {**GOOD, "messages": [{"role": "user", "content": long}], "stream": stream}), 400)
    assert error["code"] == "context_length_exceeded" and f"{CONTEXT} tokens" in error["message"]
    error = openai_error(post(url, {**GOOD, "max_tokens": CONTEXT}), 400)  # a short prompt, too long an answer
    assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_a_missing_or_wrong_api_key_is_401(server, headers):
    _, url = server
    error = openai_error(post(url, GOOD, headers=headers), 401)
    assert error["code"] == "invalid_api_key" and KEY not in error["message"]
    httpx = httpx_module()
    assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200  # health and metrics need no key, as vLLM's


def test_a_huge_body_is_413_without_being_read(server):
    _, url = server
    huge = {**GOOD, "messages": [{"role": "user", "content": "x" * (1 << 20)}]}
    error = openai_error(post(url, huge), 413)
    assert error["code"] == "request_too_large"
    # sent in chunks, with no Content-Length to refuse it by: cut off as it passes the limit
    chunked = httpx_module().post(f"{url}/v1/chat/completions", content=(b"x" * 8192 for _ in range(100)),
                                  headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
    assert openai_error(chunked, 413)["code"] == "request_too_large"


def test_unknown_paths_and_methods_are_openai_shaped(server):
    _, url = server
    httpx = httpx_module()
    missing = openai_error(httpx.get(f"{url}/v1/nothing"), 404)
    wrong_method = openai_error(httpx.get(f"{url}/v1/chat/completions", headers=AUTH), 405)
    assert "/v1/nothing" in missing["message"] or "not found" in missing["message"].lower(), missing
    assert "GET" in wrong_method["message"] or "method" in wrong_method["message"].lower(), wrong_method


def test_after_all_that_the_server_still_answers(server):
    _, url = server
    response = post(url, GOOD)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"]


def test_while_the_model_loads_requests_are_503():
    with serving(None) as (served, url):
        error = openai_error(post(url, GOOD, headers={}), 503)
        assert error["code"] == "model_not_ready" and "loading" in error["message"]
        health = httpx_module().get(f"{url}/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
