"""Tools with a remote engine: the request carries the chat's tools and its tool turns as OpenAI's API has them,
and the calls come back from the stream, in whatever pieces the server sends them (vLLM streams a call's
arguments piece by piece; our serve and llama.cpp send each call whole)."""

from __future__ import annotations

import json
import threading

from dflash_chat.chat.backends.base import AnswerRequest
from dflash_chat.chat.events import AnswerEnded
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.runtime.bridge import StreamChunk
from dflash_chat.runtime.tool_calls import ToolCall, ToolSpec
from dflash_chat.runtime.tool_use import ToolUse

from .misbehaving import chunk, chunked_head, head, sse, whole
from .test_remote import Run, answered

TOOLS = ToolUse((ToolSpec("echo", "Say it back", {"type": "object", "properties": {"text": {"type": "string"}}}),))
TURNS = [
    {"role": "user", "content": "say hi"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "echo", "arguments": {"text": "hi"}}}],
    },
    {"role": "tool", "tool_call_id": "c0", "content": "echo: hi"},
]


def calls_delta(items: list, finish: str | None = None) -> dict:
    choice = {"index": 0, "delta": {"tool_calls": items}, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}


def ask(run: Run, tools: ToolUse = TOOLS):
    sampling = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=32)
    run.backend.answer(AnswerRequest(None, TURNS, False, sampling, threading.Event(), tools=tools))
    return run.wait(AnswerEnded).end


def test_the_request_carries_the_tools_and_the_tool_turns_as_openais_api_has_them():
    with answered(
        head(), sse({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]})
    ) as server:
        run = Run(server.url)
        run.connect()
        ask(run, ToolUse(TOOLS.tools, "echo", parallel=False))
        body = json.loads(server.bodies[-1])
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Say it back",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "echo"}}
    assert body["parallel_tool_calls"] is False
    assert body["messages"][1]["tool_calls"] == [
        {"id": "c0", "type": "function", "function": {"name": "echo", "arguments": '{"text": "hi"}'}}
    ]
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "c0", "content": "echo: hi"}


def test_no_tools_means_no_tool_fields():
    with answered(
        head(), sse({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]})
    ) as server:
        run = Run(server.url)
        run.connect()
        ask(run, None)
        body = json.loads(server.bodies[-1])
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(body)


def test_calls_streamed_in_pieces_come_back_whole_in_the_last_chunk():
    stream = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me check."}, "finish_reason": None}]},
        calls_delta([{"index": 0, "id": "call-a", "type": "function", "function": {"name": "echo", "arguments": ""}}]),
        calls_delta([{"index": 0, "function": {"arguments": '{"te'}}]),
        calls_delta([{"index": 0, "function": {"arguments": 'xt": "hi"}'}}]),
        calls_delta(
            [{"index": 1, "id": "call-b", "type": "function", "function": {"name": "echo", "arguments": "{}"}}]
        ),
        calls_delta([], "tool_calls"),
        b"[DONE]",
    )
    with answered(head(), stream) as server:
        run = Run(server.url)
        run.connect()
        end = ask(run)
    assert end.reason == "stop" and end.answer == "Let me check."
    assert end.tool_calls == (ToolCall("call-a", "echo", '{"text": "hi"}'), ToolCall("call-b", "echo", "{}"))
    chunks = [e for e in run.events if isinstance(e, StreamChunk)]
    assert [c for c in chunks if c.tool_calls][-1].tool_calls == end.tool_calls


def test_a_whole_completions_calls_are_taken_and_a_call_cut_mid_stream_is_no_call():
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "x1", "type": "function", "function": {"name": "echo", "arguments": '{"text": "a"}'}},
            {"id": "x2", "type": "function", "function": {"name": "echo", "arguments": '{"text": "b"}'}},
        ],
    }
    body = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}).encode()
    with answered(whole(200, "application/json", body)) as server:
        run = Run(server.url)
        run.connect()
        end = ask(run)
    assert [(c.id, c.arguments) for c in end.tool_calls] == [("x1", '{"text": "a"}'), ("x2", '{"text": "b"}')]
    cut = sse(calls_delta([{"index": 0, "id": "y", "function": {"name": "echo", "arguments": '{"te'}}]))
    with answered(chunked_head(), chunk(cut)) as server:
        run = Run(server.url)
        run.connect()
        end = ask(run)
    assert end.reason in ("cut", "error") and end.tool_calls == () and end.error
