"""Answers held to a schema or a call through serve's three dialects, with the official clients and the demo pair
(which, unheld, never finishes a call nor writes JSON): `response_format` / `text.format` /
`output_config.format` answers validate against their schema, `tool_choice` required / any / a named tool
always brings a call with arguments valid for its tool, and a schema the engine cannot hold is a 400 in the
dialect's own error shape."""

from __future__ import annotations

import json

import jsonschema
import pytest

from .conftest import serving

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

KEY = "sk-structured"
MODEL = "dflash-chat-demo"
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 40},
        "kind": {"type": "string", "enum": ["cat", "dog", "fish"]},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city", "days"],
    },
}
FILES = {
    "name": "list_files",
    "description": "The files in a folder.",
    "parameters": {"type": "object", "properties": {"folder": {"type": "string", "maxLength": 24}}, "required": []},
}
ASK = [{"role": "user", "content": "What is the weather like in Paris this week?"}]


def _invalid(text: str) -> list[str]:
    """What jsonschema finds wrong with the answer `text` for PET (none: valid)."""
    return [e.message for e in jsonschema.Draft202012Validator(PET).iter_errors(json.loads(text))]


@pytest.fixture(scope="module")
def url(demo_pair):
    with serving(demo_pair, api_key=KEY) as (_, address):
        yield address


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(url):
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)


def test_response_format_json_schema_answers_validate(client):
    for temperature in (0.0, 0.7):
        answer = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe a pet."}],
            response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}},
            temperature=temperature,
            seed=5,
            max_tokens=120,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PET)


def test_json_object_is_a_json_object_and_parse_fills_a_pydantic_model(client):
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format={"type": "json_object"},
        max_tokens=120,
    )
    assert isinstance(json.loads(answer.choices[0].message.content), dict)

    pydantic = pytest.importorskip("pydantic")

    class Pet(pydantic.BaseModel):
        name: str
        age: int
        good: bool

    parsed = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "A pet, please."}], response_format=Pet, max_tokens=120
    )
    assert isinstance(parsed.choices[0].message.parsed, Pet)


def test_responses_text_format_and_anthropic_output_config_validate(client, claude):
    response = client.responses.create(
        model=MODEL,
        input="Describe a pet.",
        text={"format": {"type": "json_schema", "name": "pet", "schema": PET, "strict": True}},
        max_output_tokens=120,
    )
    assert _invalid(response.output_text) == []
    message = claude.messages.create(
        model=MODEL,
        max_tokens=120,
        messages=[{"role": "user", "content": "Describe a pet."}],
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": PET}}},
    )
    assert _invalid(message.content[0].text) == []


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_a_forced_call_is_a_call_with_valid_arguments_in_chat_completions(client, choice):
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    for temperature in (0.0, 0.7):
        answer = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[{"type": "function", "function": WEATHER}, {"type": "function", "function": FILES}],
            tool_choice=tool_choice,
            temperature=temperature,
            seed=2,
            max_tokens=160,
        )
        message = answer.choices[0].message
        assert answer.choices[0].finish_reason == "tool_calls", message.content
        assert message.tool_calls and "<tool_call>" not in (message.content or "")
        for call in message.tool_calls:
            spec = WEATHER if call.function.name == "get_weather" else FILES
            assert choice == "required" or call.function.name == choice
            jsonschema.validate(json.loads(call.function.arguments), spec["parameters"])


def test_anthropic_any_and_responses_required_bring_a_call(client, claude):
    tool = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
    message = claude.messages.create(
        model=MODEL, max_tokens=160, messages=ASK, tools=[tool], tool_choice={"type": "any"}
    )
    assert message.stop_reason == "tool_use"
    used = [b for b in message.content if b.type == "tool_use"]
    assert used and all(b.name == "get_weather" for b in used)
    jsonschema.validate(used[0].input, WEATHER["parameters"])
    response = client.responses.create(
        model=MODEL,
        input=ASK[0]["content"],
        tools=[{"type": "function", **WEATHER}],
        tool_choice="required",
        max_output_tokens=160,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, "not valid"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, ""),
    ],
)
def test_a_schema_that_cannot_be_held_is_a_400_in_each_dialect(url, client, claude, schema, words):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            max_tokens=8,
        )
    assert refused.value.status_code == 400 and words in str(refused.value)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}},
        )
    with pytest.raises(openai.BadRequestError):
        client.responses.create(
            model=MODEL, input="hi", text={"format": {"type": "json_schema", "name": "x", "schema": schema}}
        )


def test_a_call_cut_by_max_tokens_ends_with_length_and_is_never_reported_as_a_call(client):
    answer = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[{"type": "function", "function": WEATHER}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=3,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
