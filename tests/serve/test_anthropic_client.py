"""/v1/messages driven by Anthropic's own SDK against the demo pair: the same answers as chat completions,
streamed and whole alike, tools and tool results, thinking, count_tokens, and Anthropic-shaped errors."""

from __future__ import annotations

import json

import pytest

from dflash_chat.runtime.endpoint import httpx_module

from .conftest import serving

anthropic = pytest.importorskip("anthropic")

KEY = "sk-ant-test"
QUESTION = "What does the with statement do?"
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city now",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
}


@pytest.fixture(scope="module")
def server(demo_pair):
    with serving(demo_pair, api_key=KEY, max_body=4 * 1024 * 1024) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    _, url = server
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)


GREEDY = {"temperature": 0}  # the SDK no longer names sampling fields; serve still reads them


def ask(client, **extra):
    body = {"model": "claude-sonnet-4-5", "max_tokens": 24, "messages": [{"role": "user", "content": QUESTION}]}
    return client.messages.create(**{**body, **extra}, extra_body=GREEDY)


def test_an_answer_is_the_chat_completions_answer_for_the_same_conversation(server, client):
    _, url = server
    message = ask(client, system="Answer briefly.")
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content[0].type == "text"
    chat = (
        httpx_module()
        .post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={
                "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}],
                "max_tokens": 24,
                "temperature": 0,
            },
            timeout=120,
        )
        .json()
    )
    assert message.content[0].text == chat["choices"][0]["message"]["content"]
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat["usage"]["prompt_tokens"]
    assert usage.output_tokens == chat["usage"]["completion_tokens"]


def test_a_stream_assembles_to_the_whole_answer(client):
    whole = ask(client)
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=24, messages=[{"role": "user", "content": QUESTION}], extra_body=GREEDY
    ) as stream:
        events = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events
    assert [block.model_dump() for block in streamed.content] == [block.model_dump() for block in whole.content]
    assert streamed.stop_reason == whole.stop_reason and streamed.usage.output_tokens == whole.usage.output_tokens


def test_count_tokens_counts_the_prompt_the_answer_gets(client):
    counted = client.messages.count_tokens(model="claude-sonnet-4-5", messages=[{"role": "user", "content": QUESTION}])
    message = ask(client)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens > 0


def test_tools_a_forced_call_and_a_tool_result_round_trip(client):
    forced = ask(client, tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=48)
    for block in forced.content:
        if block.type == "tool_use":  # the demo target writes a call when it knows how; either way no error
            assert block.name == "get_weather" and isinstance(block.input, dict) and block.id.startswith("toolu_")
            assert forced.stop_reason == "tool_use"
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]},
    ]
    answer = client.messages.create(model="x", max_tokens=16, tools=[TOOL], messages=messages, extra_body=GREEDY)
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    none = ask(client, tools=[TOOL], tool_choice={"type": "none"})
    assert all(block.type != "tool_use" for block in none.content)


def test_thinking_on_is_the_thinking_switch(client):
    thought = ask(client, thinking={"type": "adaptive"}, max_tokens=40)
    plain = ask(client, thinking={"type": "disabled"}, max_tokens=40)
    kinds = [block.type for block in thought.content]
    assert kinds[0] == "thinking" or thought.stop_reason == "max_tokens"  # the demo thinks first, if it can finish
    assert all(block.type != "thinking" for block in plain.content)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "'max_tokens' is required"),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "image block",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}],
            },
            "answers no tool_use",
        ),
        ({"max_tokens": 4, "messages": [{"role": "robot", "content": "hi"}]}, "user, assistant or system"),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "tool"}},
            "name the tool",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "lots"}},
            "thinking.type",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "thinking": {"type": "enabled", "budget_tokens": -5},
            },
            "at least 1024; got -5",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "thinking": {"type": "enabled", "budget_tokens": "lots"},
            },
            "whole number of at least 1024; got 'lots'",
        ),
        (
            {
                "max_tokens": 2048,
                "messages": [{"role": "user", "content": "hi"}],
                "thinking": {"type": "enabled", "budget_tokens": 2048},
            },
            "'max_tokens' must be greater than 'thinking.budget_tokens' (2048)",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "f", "input_schema": {"type": "string"}}],
            },
            "of type 'object'",
        ),
    ],
)
def test_bad_bodies_are_anthropic_shaped_400s(server, body, words):
    _, url = server
    response = httpx_module().post(f"{url}/v1/messages", headers={"x-api-key": KEY}, json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert words in error["error"]["message"] and "Traceback" not in response.text


def test_a_deep_schema_and_a_huge_one_are_refused_in_words(server):
    _, url = server
    schema: dict = {"type": "string"}
    for _ in range(70):
        schema = {"type": "object", "properties": {"x": schema}}
    huge = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(10_000)},
    }
    for input_schema, words in ((schema, "nests deeper than 64"), (huge, "context")):
        body = {
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": input_schema}],
        }
        response = httpx_module().post(
            f"{url}/v1/messages",
            headers={"x-api-key": KEY, "Content-Type": "application/json"},
            content=json.dumps(body),
            timeout=120,
        )
        assert response.status_code == 400 and words in response.json()["error"]["message"], response.text


def test_a_wrong_key_is_an_authentication_error(server):
    _, url = server
    wrong = anthropic.Anthropic(base_url=url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "authentication_error"


def test_metrics_count_each_route_and_answers_carry_the_engines_figures(server, client):
    _, url = server

    def count(route: str) -> float:
        text = httpx_module().get(f"{url}/metrics").text
        line = next(
            (x for x in text.splitlines() if x.startswith("dflash:route_requests_total") and f'route="{route}"' in x),
            None,
        )
        return float(line.rsplit(" ", 1)[1]) if line else 0.0

    before = count("messages")
    raw = (
        httpx_module()
        .post(
            f"{url}/v1/messages",
            headers={"x-api-key": KEY},
            json={"max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": QUESTION}]},
            timeout=120,
        )
        .json()
    )
    assert count("messages") == before + 1
    assert raw["metrics"]["speculative_decoding"]["num_draft_tokens"] >= 0 and "timings" in raw


def test_a_prefill_is_continued_as_anthropic_continues_it(server, client, demo_pair):
    """A last assistant message is the answer's beginning: the model goes on from it (the same greedy text as a
    raw completion of the rendered chat with the prefill after its generation prompt), and the answer holds
    only what follows it."""
    _, url = server
    prefill = "Sure. Here is the code:\n```python\ndef"
    message = ask(client, messages=[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": prefill}])
    turns = [{"role": "user", "content": QUESTION}]
    rendered = demo_pair.tokenizer.apply_chat_template(
        turns, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    raw = (
        httpx_module()
        .post(
            f"{url}/v1/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"prompt": rendered + prefill, "max_tokens": 24, "temperature": 0},
            timeout=120,
        )
        .raise_for_status()
        .json()
    )
    assert message.content[0].text and message.content[0].text == raw["choices"][0]["text"]
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == raw["usage"]["prompt_tokens"]
    trailing = {"role": "assistant", "content": "Sure. "}
    response = httpx_module().post(
        f"{url}/v1/messages",
        headers={"x-api-key": KEY},
        json={"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, trailing]},
        timeout=60,
    )
    assert response.status_code == 400 and "cannot end with whitespace" in response.text
