"""Bad requests get the right status and an OpenAI-shaped error, never a traceback; the server goes on."""

from __future__ import annotations

import pytest

from dflash_chat.runtime.endpoint import httpx_module

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
        return httpx.post(
            url + path, content=content, headers={**headers, "Content-Type": "application/json"}, timeout=60
        )
    return httpx.post(url + path, json=payload, headers=headers, timeout=60)


def openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"model": "dflash-chat-demo", "messages": [', "not valid JSON"),
        (b"[1, 2, 3]", "must be a JSON object"),
        (b"\xff\xfe not text", "not valid JSON"),
    ],
)
def test_malformed_json_is_400(server, content, words):
    _, url = server
    error = openai_error(post(url, content=content), 400)
    assert words in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "change, param",
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].image_url",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content"),
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
    ],
)
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
    assert "serve --context 8192" in error["message"] and "dflash-chat launch" in error["message"]  # the fix


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_asked_longer_than_the_context_has_room_for_is_cut_to_that_room(server, stream):
    """As local runtimes do (agents ask for max_tokens 32000 whatever the context): a header says so."""
    _, url = server
    response = post(url, {**GOOD, "max_tokens": CONTEXT, "stream": stream, "temperature": 0})
    assert response.status_code == 200, response.text
    room = int(response.headers["x-max-tokens-clamped"])
    assert 0 < room < CONTEXT
    if not stream:
        usage = response.json()["usage"]
        assert usage["prompt_tokens"] + room == CONTEXT and usage["completion_tokens"] <= room
    assert "x-max-tokens-clamped" not in post(url, {**GOOD, "max_tokens": 2}).headers


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
    chunked = httpx_module().post(
        f"{url}/v1/chat/completions",
        content=(b"x" * 8192 for _ in range(100)),
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=60,
    )
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


# shapes no field check foresaw: each a 400 in OpenAI's shape, one log line, never a traceback


@pytest.mark.parametrize(
    "content, param, words",
    [
        (b'{"messages": [{"role": ["user"], "content": "hi"}]}', "messages[0].role", "got list"),
        (b'{"messages": [{"role": {"user": 1}, "content": "hi"}]}', "messages[0].role", "got dict"),
        (b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", None, "nests deeper than 64 levels"),
        (b'{"x": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b', "messages": []}', None, "nests deeper"),
        (b'{"messages": [{"role": "user", "content": "\\ud800 lone"}]}', None, "lone surrogate \\ud800"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', None, "not finite"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "seed": ' + b"9" * 5000 + b"}", None, "digits"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "top_k": 1e400}', "top_k", "whole number"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "top_k": 99999999999999999999}', "top_k", "whole number"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": [1]}', "temperature", "got list"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["' + b"s" * 2000 + b'"]}', "stop", "1000"),
    ],
)
def test_odd_bodies_are_400_with_no_python_text(server, caplog, content, param, words):
    _, url = server
    with caplog.at_level("WARNING", logger="dflash_chat.serve"):
        error = openai_error(post(url, content=content), 400)
    assert words in error["message"] and error["param"] == param
    for python in ("Error:", "Traceback", "object has no attribute", "unhashable"):
        assert python not in error["message"]
    lines = [r for r in caplog.records if r.name == "dflash_chat.serve"]
    assert len(lines) == 1 and lines[0].exc_info is None and "400 POST /v1/chat/completions" in lines[0].getMessage()


def test_token_ids_past_the_vocabulary_are_refused_before_the_engine(server, demo_pair, monkeypatch):
    served, url = server
    ran = []
    monkeypatch.setattr(demo_pair.engine, "generate", lambda *a, **k: ran.append(a) or iter(()))
    vocab = served.vocab
    assert vocab is not None and vocab <= demo_pair.engine.target.cfg.vocab_size
    for ids in ([1, 2, vocab], [vocab + 10**6], [10**30]):
        error = openai_error(post(url, {"prompt": ids, "max_tokens": 2}, path="/v1/completions"), 400)
        assert error["param"] == "prompt" and error["code"] == "invalid_token_id" and str(vocab) in error["message"]
    assert ran == []


def test_a_server_fault_is_500_without_its_text(server, monkeypatch, caplog):
    served, url = server

    def broken(request):
        raise KeyError("secret internals")

    monkeypatch.setattr(served, "prompt", broken)  # rendering the prompt fails
    with caplog.at_level("WARNING", logger="dflash_chat.serve"):
        error = openai_error(post(url, GOOD), 500)
    assert "secret" not in error["message"] and "KeyError" not in error["message"]
    assert error["type"] == "server_error" and "log" in error["message"]
    logged = [r.getMessage() for r in caplog.records if r.name == "dflash_chat.serve"]
    assert len(logged) == 1 and "KeyError" in logged[0]


def test_an_engine_failure_mid_answer_sends_no_exception_text(server, demo_pair, monkeypatch):
    _, url = server

    def generate(*args, **keys):
        raise RuntimeError("CUDA error: device-side assert at 0xdeadbeef")
        yield

    monkeypatch.setattr(demo_pair.engine, "generate", generate)
    error = openai_error(post(url, GOOD), 500)
    assert "CUDA" not in error["message"] and "deadbeef" not in error["message"]
    with httpx_module().stream(
        "POST", f"{url}/v1/chat/completions", json={**GOOD, "stream": True}, headers=AUTH, timeout=30
    ) as response:
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and '"error"' in events[-2] and "CUDA" not in events[-2]


def test_the_openai_client_reads_each_refusal_as_its_own_error(server):
    import openai

    served, url = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="dflash-chat-demo", prompt=[served.vocab], max_tokens=2)
    assert refused.value.code == "invalid_token_id"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="dflash-chat-demo", messages=[{"role": ["user"], "content": "hi"}])
    assert refused.value.param == "messages[0].role"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.parametrize(
    "items",
    [
        [{"type": "reasoning", "id": "rs_1", "summary": []}],
        [{"type": "item_reference", "id": "msg_1"}, {"type": "reasoning", "id": "rs_2", "summary": []}],
    ],
)
def test_responses_input_with_nothing_to_answer_is_400(server, items):
    """Reasoning and item_reference items are not read: input holding only them has nothing to answer."""
    _, url = server
    body = {"model": "dflash-chat-demo", "input": items, "max_output_tokens": 2}
    error = openai_error(post(url, body, path="/v1/responses"), 400)
    assert error["param"] == "input" and "no message" in error["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_messages_the_template_refuses_are_400_with_its_words(server, monkeypatch, path):
    """A model's own template raises on shapes it does not take (Qwen's: a system message past the first); that
    is the client's error, in its route's shape, with the template's words, not a 500."""
    served, url = server
    template = "{{ raise_exception('System message must be at the beginning.') }}"
    monkeypatch.setattr(served._checker, "chat_template", template)
    text = f"a message no earlier request sent ({path})"  # so no prompt held from before serves it unrendered
    body = {"model": "dflash-chat-demo", "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    if path == "/v1/responses":
        body = {"model": "dflash-chat-demo", "max_output_tokens": 2, "input": text}
    response = post(url, body, path=path)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "System message must be at the beginning" in error["message"] and "Traceback" not in error["message"]
    assert error["type"] == "invalid_request_error"
