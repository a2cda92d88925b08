"""/v1/responses driven by the `openai` client's responses API against the demo pair: the same answers as chat
completions, streamed and whole alike, a function call round trip through previous_response_id, and bad
bodies refused in words."""

from __future__ import annotations

import pytest

from dflash_chat.runtime.endpoint import httpx_module

from .conftest import serving

openai = pytest.importorskip("openai")

KEY = "sk-test-responses"
MODEL = "dflash-chat-demo"
QUESTION = "What does the with statement do?"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def server(demo_pair):
    with serving(demo_pair, api_key=KEY) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    served, url = server
    served.name = MODEL
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_an_answer_is_the_chat_completions_answer_for_the_same_conversation(client):
    response = client.responses.create(
        model=MODEL, instructions="Answer briefly.", input=QUESTION, max_output_tokens=24, temperature=0
    )
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}],
        max_tokens=24,
        temperature=0,
    )
    assert response.id.startswith("resp_") and response.output[0].type == "message"
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")


def test_a_stream_assembles_to_the_whole_answer(client):
    whole = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0)
    events = list(
        client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0, stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text


def test_a_function_call_round_trip_through_previous_response_id(client):
    first = client.responses.create(
        model=MODEL, input="Weather in Oslo?", tools=[TOOL], tool_choice="required", max_output_tokens=48, temperature=0
    )
    calls = [item for item in first.output if item.type == "function_call"]
    for call in calls:  # the demo target writes a call when it knows how; either way no error
        assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    call_id = calls[0].call_id if calls else None
    if call_id is None:  # answer a call of our own, written into the input
        item = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
        follow = client.responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": "Weather in Oslo?"},
                item,
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
            tools=[TOOL],
            max_output_tokens=16,
            temperature=0,
        )
    else:
        follow = client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call_id, "output": "sunny, 21 C"}],
            tools=[TOOL],
            max_output_tokens=16,
            temperature=0,
        )
    assert follow.status in ("completed", "incomplete") and follow.output


@pytest.mark.parametrize(
    "body, words",
    [
        ({"input": []}, "non-empty list"),
        ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]}, "answers no function_call"),
        ({"input": "hi", "previous_response_id": "resp_nope"}, "not a response this server keeps"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "image"),
        ({"input": [{"type": "telepathy"}]}, "not an input item"),
        ({"input": "hi", "reasoning": {"effort": "maximal"}}, "medium, high or xhigh; got"),
        ({"input": "hi", "tools": [{"type": "function", "name": "has space"}]}, "letters"),
    ],
)
def test_bad_bodies_are_400s_in_words(server, body, words):
    _, url = server
    response = httpx_module().post(
        f"{url}/v1/responses", headers={"Authorization": f"Bearer {KEY}"}, json={"model": MODEL, **body}, timeout=60
    )
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"] and "Traceback" not in response.text
