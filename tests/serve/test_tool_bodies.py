"""Bad tool bodies on /v1/chat/completions: each a 400 in OpenAI's shape naming the field, never a traceback."""

from __future__ import annotations

import json

import pytest

from .conftest import serving
from .test_bad_input import KEY, openai_error, post


@pytest.fixture(scope="module")
def server(demo_pair):
    with serving(demo_pair, api_key=KEY, max_body=4 * 1024 * 1024) as running:
        yield running


USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"messages": [USER], "tools": {"a": 1}}, "tools", "must be a list"),
        ({"messages": [USER], "tools": [{"type": "function"}]}, "tools[0]", "must be"),
        ({"messages": [USER], "tools": [{"type": "retrieval", "function": {}}]}, "tools[0]", "must be"),
        ({"messages": [USER], "tools": [{"function": {"name": "has space"}}]}, "tools[0].function.name", "letters"),
        ({"messages": [USER], "tools": [{"function": {"name": 5}}]}, "tools[0].function.name", "got 5"),
        ({"messages": [USER], "tools": [{"function": {"name": "f", "description": ["x"]}}]}, None, "description"),
        ({"messages": [USER], "tools": [{"function": {"name": "f", "parameters": {"type": "array"}}}]}, None, "object"),
        ({"messages": [USER], "tools": [TOOL, TOOL]}, "tools", "twice"),
        ({"messages": [USER], "tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "got 'sometimes'"),
        (
            {"messages": [USER], "tools": [TOOL], "tool_choice": {"type": "function"}},
            "tool_choice",
            "must be auto, none, required or",
        ),
        (
            {"messages": [USER], "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not among the tools (get_weather)",
        ),
        ({"messages": [USER], "tool_choice": "required"}, "tool_choice", "offers no tools"),
        ({"messages": [USER], "tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
        ({"messages": [USER, {"role": "tool", "content": "sunny"}]}, "messages[1].tool_call_id", "must name the call"),
        (
            {"messages": [USER, {"role": "tool", "content": "sunny", "tool_call_id": "call_9"}]},
            "messages[1].tool_call_id",
            "answers no tool call",
        ),
        (
            {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": {"id": 1}}]},
            "messages[1].tool_calls",
            "must be a list",
        ),
        (
            {
                "messages": [
                    USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": "{x"}}],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
            "does not parse",
        ),
        (
            {"messages": [USER], "tools": [{"function": {"name": "f", "parameters": deep_schema(70)}}]},
            None,
            "nests deeper than 64 levels",
        ),
    ],
)
def test_bad_tool_bodies_are_400_naming_the_field(server, body, param, words):
    _, url = server
    error = openai_error(post(url, content=json.dumps(body).encode()), 400)
    assert words in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param
    for python in ("Error:", "Traceback", "object has no attribute", "unhashable", "KeyError"):
        assert python not in error["message"]


def test_a_megabyte_description_is_refused_for_the_context_not_by_a_crash(server):
    _, url = server
    tool = {"type": "function", "function": {"name": "f", "description": "word " * 200_000}}
    error = openai_error(post(url, content=json.dumps({"messages": [USER], "tools": [tool]}).encode()), 400)
    assert error["code"] == "context_length_exceeded"


def test_a_tool_round_trip_is_a_valid_conversation(server):
    """A call the assistant made, the tool's answer, and the next request: rendered and answered."""
    _, url = server
    messages = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    messages.append({"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_1"})
    body = {"messages": messages, "tools": [TOOL], "max_tokens": 4, "temperature": 0}
    response = post(url, content=json.dumps(body).encode())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}


def test_server_tools_are_refused_by_name(server):
    """Anthropic's server tools (web search, code execution) run on Anthropic's servers: nothing here runs them, so
    the request is a 400 in Anthropic's shape naming each one, not an answer that drops them."""
    _, url = server
    tools = [ANTHROPIC_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]
    body = {"model": "dflash-chat-demo", "messages": [USER], "max_tokens": 2, "tools": tools}
    response = post(url, body, path="/v1/messages")
    assert response.status_code == 400, response.text
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
    message = response.json()["error"]["message"]
    assert "web_search_20250305 'web_search' (tools[1])" in message and "get_weather" not in message


def test_responses_built_in_tools_are_left_out_not_echoed_as_taken(server):
    """Responses' built-in tools (web_search, file_search, Codex's namespace groups) run on OpenAI's servers, and
    Codex sends some with every request: they are left out of the prompt, and the response's `tools` lists only
    the function tools it took, never them as if taken."""
    _, url = server
    tools = [{"type": "web_search"}, RESPONSES_TOOL, {"type": "file_search", "vector_store_ids": ["vs_1"]}]
    body = {"model": "dflash-chat-demo", "input": "hi", "max_output_tokens": 16, "tools": tools}
    response = post(url, body, path="/v1/responses")
    assert response.status_code == 200, response.text
    assert response.json()["tools"] == [RESPONSES_TOOL]
