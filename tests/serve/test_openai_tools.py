"""The official `openai` client against serve with the demo pair, on held-out tool chats shipped beside it
(demo_data/tool_prompts.json: tool and parameter names no training chat used): for each `tool_choice` (auto,
none, required, a named function), streamed and not, parallel calls, and a tool message round trip. The calls
are the model's own (greedy); their arguments must be JSON typed by the tool's schema, and a streamed answer
must assemble to the non-streamed one.

The tests of calls need a demo target that calls tools (the recipe's tools stage, train/stages/tools.py). The
`calling` fixture asks once, through serve, whether the shipped one calls the held-out tool a request asks for,
and skips them with its answer until it does; the tests of text answers run on any target, and the same
client code reads the calls of a scripted pair that calls on cue (tests/engine/scripted.py)."""

from __future__ import annotations

import json

import pytest

from dflash_chat.train.tool_checks import schema_errors

from .conftest import serving

openai = pytest.importorskip("openai")

KEY = "sk-tools"
MODEL = "dflash-chat-demo"
TOKENS = 96
ONE_CALL = 0  # which held-out one-call request, of those offering several tools, the tests ask


@pytest.fixture(scope="module")
def client(demo_pair):
    with serving(demo_pair, api_key=KEY) as (_, url):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def chats():
    """Held-out chats: a one-call request among several tools, the first two-call request, the first question
    no tool fits."""
    from dflash_chat.train.tool_bench import heldout_chats

    every = heldout_chats()
    one = [c for c in every if c.call is not None and not c.more and len(c.tools) > 1]
    return {
        "one": one[ONE_CALL],
        "two": next(c for c in every if c.more),
        "none": next(c for c in every if c.call is None),
    }


@pytest.fixture(scope="module")
def calling(client, chats):
    """Skips unless the shipped demo target answers the one-call request with a call to the tool asked for."""
    whole, *_ = ask(client, chats["one"])
    if [c["name"] for c in whole["tool_calls"]] != [chats["one"].call.name]:
        pytest.skip(
            "the shipped demo target does not call held-out tools yet: its greedy answer to "
            f"{chats['one'].request!r} is {whole['content'][:60]!r} (the tools stage has not shipped a target)"
        )


def ask(client, chat, messages=None, **fields):
    """The answer to `chat`'s request (or `messages`) with its tools offered, greedy, non-streamed and
    streamed: (message, finish_reason, streamed message, streamed finish_reason) as plain dicts."""
    body = {
        "model": MODEL,
        "messages": messages or [{"role": "user", "content": chat.request}],
        "tools": [t.as_openai() for t in chat.tools],
        "max_tokens": TOKENS,
        "temperature": 0,
        **fields,
    }
    whole = client.chat.completions.create(**body)
    choice = whole.choices[0]
    message = {"content": choice.message.content or "", "tool_calls": _calls(choice.message.tool_calls or [])}
    return message, choice.finish_reason, *assembled(client.chat.completions.create(**body, stream=True))


def _calls(calls) -> list[dict]:
    return [{"id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments} for c in calls]


def assembled(stream) -> tuple[dict, str]:
    """A streamed answer put together as clients do: content appended, tool-call items merged by index (the
    first item of a call has its id, type and name; later ones append to its arguments)."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        for item in delta.tool_calls or ():
            if item.index not in calls:
                assert item.id and item.type == "function" and item.function.name, item
                calls[item.index] = {"id": item.id, "type": item.type, "name": item.function.name, "arguments": ""}
            calls[item.index]["arguments"] += item.function.arguments or ""
        finish = choice.finish_reason or finish
    assert sorted(calls) == list(range(len(calls)))  # indices 0, 1, ... in order
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)]}, finish


def same_answer(whole: dict, streamed: dict) -> None:
    """The streamed answer equals the non-streamed one (each call's id is its own)."""
    assert streamed["content"] == whole["content"]
    strip = [{k: v for k, v in c.items() if k != "id"} for c in whole["tool_calls"]]
    assert [{k: v for k, v in c.items() if k != "id"} for c in streamed["tool_calls"]] == strip


def typed_arguments(call: dict, chat) -> dict:
    """The call's arguments: a JSON object its tool's schema accepts (values typed by the schema)."""
    tool = next(t for t in chat.tools if t.name == call["name"])
    arguments = json.loads(call["arguments"])
    assert isinstance(arguments, dict) and schema_errors(tool.parameters, arguments) == [], arguments
    return arguments


def test_auto_the_model_calls_the_tool_asked_for_with_typed_arguments(client, chats, calling):
    chat = chats["one"]
    whole, finish, streamed, streamed_finish = ask(client, chat)
    assert finish == streamed_finish == "tool_calls"
    assert [c["name"] for c in whole["tool_calls"]] == [chat.call.name] and whole["content"] == ""
    assert typed_arguments(whole["tool_calls"][0], chat) == chat.call.arguments
    assert whole["tool_calls"][0]["id"].startswith("call_") and whole["tool_calls"][0]["type"] == "function"
    same_answer(whole, streamed)


def test_auto_a_question_no_tool_fits_is_answered_in_text(client, chats):
    chat = chats["none"]
    whole, finish, streamed, streamed_finish = ask(client, chat)
    assert whole["tool_calls"] == [] and whole["content"].strip()
    assert finish == streamed_finish and finish in ("stop", "length")
    same_answer(whole, streamed)


def test_none_offers_no_tools_and_the_answer_is_text(client, chats):
    chat = chats["one"]
    whole, finish, streamed, streamed_finish = ask(client, chat, tool_choice="none")
    assert whole["tool_calls"] == [] and "<tool_call>" not in whole["content"] and whole["content"].strip()
    assert finish == streamed_finish and finish in ("stop", "length")
    same_answer(whole, streamed)


def test_required_makes_a_call_even_where_the_model_would_answer_in_text(client, chats, calling):
    chat = chats["none"]
    whole, finish, streamed, streamed_finish = ask(client, chat, tool_choice="required")
    assert finish == streamed_finish == "tool_calls" and len(whole["tool_calls"]) >= 1
    for call in whole["tool_calls"]:
        assert call["name"] in {t.name for t in chat.tools}
        json.loads(call["arguments"])
    same_answer(whole, streamed)


def test_a_named_function_is_the_one_called(client, chats, calling):
    chat = chats["one"]
    other = next(t.name for t in chat.tools if t.name != chat.call.name)
    named = {"type": "function", "function": {"name": other}}
    whole, finish, streamed, streamed_finish = ask(client, chat, tool_choice=named)
    assert finish == streamed_finish == "tool_calls"
    assert [c["name"] for c in whole["tool_calls"]][:1] == [other]
    assert isinstance(json.loads(whole["tool_calls"][0]["arguments"]), dict)
    same_answer(whole, streamed)


def test_parallel_calls_come_by_index_and_parallel_false_keeps_the_first(client, chats, calling):
    chat = chats["two"]
    whole, finish, streamed, streamed_finish = ask(client, chat)
    assert finish == streamed_finish == "tool_calls"
    assert [c["name"] for c in whole["tool_calls"]] == [c.name for c in chat.calls]
    assert [typed_arguments(c, chat) for c in whole["tool_calls"]] == [c.arguments for c in chat.calls]
    assert len({c["id"] for c in whole["tool_calls"]}) == 2
    same_answer(whole, streamed)
    one, finish, streamed, streamed_finish = ask(client, chat, parallel_tool_calls=False)
    assert [c["name"] for c in one["tool_calls"]] == [chat.call.name] and finish == streamed_finish == "tool_calls"
    same_answer(one, streamed)


def test_a_tool_result_goes_back_and_the_answer_quotes_it(client, chats, calling):
    from dflash_chat.train.tool_corpus import result_values

    chat = chats["one"]
    whole, *_ = ask(client, chat)
    call = whole["tool_calls"][0]
    messages = [
        {"role": "user", "content": chat.request},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call["id"], "type": "function", "function": {k: call[k] for k in ("name", "arguments")}}
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": chat.result},
    ]
    answer, finish, streamed, streamed_finish = ask(client, chat, messages)
    assert answer["tool_calls"] == [] and finish == streamed_finish == "stop"
    assert all(value in answer["content"] for value in result_values(chat.result)), (chat.result, answer)
    same_answer(answer, streamed)


@pytest.fixture(scope="module")
def scripted_client(calling_pair):
    """The client against serve running the scripted pair that calls `echo` in every answer, on its own."""
    from dflash_chat.engine.load import load_pair

    with serving(load_pair(*calling_pair, device="cpu", max_context=1024), api_key=KEY) as (_, url):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_a_call_the_engine_writes_reaches_the_client_whole_streamed_or_not(scripted_client):
    """Whatever the demo target can do: a call the engine writes is a tool call to the client, with an id and
    JSON arguments, finish_reason tool_calls, and the streamed items assemble to the non-streamed call."""
    from dflash_chat.runtime.tool_calls import ToolSpec
    from dflash_chat.train.tool_corpus import ToolChat

    echo = ToolSpec("echo", "Say the text back.", {"type": "object", "properties": {"text": {"type": "string"}}})
    chat = ToolChat((echo,), "Say hello.", None)
    whole, finish, streamed, streamed_finish = ask(scripted_client, chat)
    assert finish == streamed_finish == "tool_calls"
    assert [c["name"] for c in whole["tool_calls"]] == ["echo"] and json.loads(
        whole["tool_calls"][0]["arguments"]
    ) == {}
    assert whole["tool_calls"][0]["id"].startswith("call_") and whole["content"] == ""
    same_answer(whole, streamed)
    text, finish, streamed, _ = ask(scripted_client, chat, tool_choice="none")
    assert text["tool_calls"] == [] and finish != "tool_calls"
    same_answer(text, streamed)
