"""The agent loop's rules (chat/agent.py), with a real server behind it: what an answer offers, which calls
run and which are answered at once, the round limit, "always", and Esc."""

from __future__ import annotations

import threading

import pytest

from dflash_chat.chat.agent import AgentLoop, ServersWaited, ToolCallDone
from dflash_chat.chat.conversation import CANCELLED, COMPLETE, ERROR, SKIPPED, Conversation
from dflash_chat.chat.tools.choice import ChatTools
from dflash_chat.chat.tools.servers import ToolServers
from dflash_chat.runtime.tool_calls import ToolCall

from .tool_servers import calls_made, mcp_settings


@pytest.fixture
def servers(tmp_path):
    servers = ToolServers(mcp_settings(tmp_path / "calls.txt", rounds=2), tmp_path / "logs")
    yield servers
    servers.close()


def ready_loop(servers, conversation=None, **kwargs) -> AgentLoop:
    loop = AgentLoop(conversation or Conversation(), servers, servers.settings, **kwargs)
    posted = []
    servers.start(loop.servers_to_start())
    loop.wait_for_servers(["test"], posted.append)
    assert posted == [ServersWaited(loop, ("test",))] and loop.servers_to_start() == []
    return loop


def test_an_answer_offers_the_chats_tools_and_its_calls_run_through_the_server(servers, tmp_path):
    conversation = Conversation(tools=ChatTools(offered=frozenset({"test/echo", "test/fail"}), choice="test/echo"))
    loop = ready_loop(servers, conversation)
    use = loop.tool_use()
    assert [t.name for t in use.tools] == ["echo", "fail"] and use.choice == "echo"
    assert loop.tool_use().choice == "auto"  # the answers after the first choose freely
    call = ToolCall("c1", "echo", '{"text": "hi"}')
    assert loop.answered((call,)) == [] and loop.rounds == 1
    pending = loop.next_call()
    assert pending.route == ("test", "echo") and pending.key == "test/echo" and loop.next_call() is None
    assert loop.refused(pending) is None and loop.asks(pending)
    posted = []
    loop.run(pending, posted.append)
    assert posted == [ToolCallDone(loop, pending, posted[0].result)]
    assert posted[0].result.status == COMPLETE and posted[0].result.text == "echo: hi"
    message = AgentLoop.result_message(pending, posted[0].result)
    assert (message.role, message.tool_call_id, message.content) == ("tool", "c1", "echo: hi")
    assert calls_made(tmp_path / "calls.txt") == ["echo hi"]


def test_calls_that_cannot_run_are_answered_at_once_and_never_reach_the_server(servers, tmp_path):
    loop = ready_loop(servers, Conversation(tools=ChatTools(offered=frozenset({"test/echo"}))))
    loop.tool_use()
    loop.answered((ToolCall("a", "flood", "{}"), ToolCall("b", "echo", "[1, 2]"), ToolCall("c", "echo", "{bad")))
    refused = [loop.refused(loop.next_call()) for _ in range(3)]
    assert [r.status for r in refused] == [ERROR] * 3
    assert refused[0].text == "Not run: no tool named 'flood' is offered in this chat."  # not ticked in this chat
    assert refused[1].text.startswith("Not run: the arguments are not a JSON object: [1, 2]")
    assert calls_made(tmp_path / "calls.txt") == []


def test_past_the_round_limit_the_calls_are_answered_as_not_run(servers):
    loop = ready_loop(servers)
    for round_ in (1, 2):
        loop.tool_use()
        assert loop.answered((ToolCall(f"c{round_}", "echo", "{}"),)) == []
        loop.next_call()
    loop.tool_use()
    over = loop.answered((ToolCall("c3", "echo", "{}"), ToolCall("c4", "fail", "{}")))
    assert [(p.call.id, r.status) for p, r in over] == [("c3", SKIPPED), ("c4", SKIPPED)]
    assert "limit of 2 rounds of tool calls (the mcp.rounds setting)" in over[0][1].text and loop.queue == []


def test_always_is_kept_in_the_chats_choice(servers):
    conversation = Conversation()
    loop = ready_loop(servers, conversation)
    loop.tool_use()
    loop.answered((ToolCall("c1", "echo", "{}"), ToolCall("c2", "echo", "{}"), ToolCall("c3", "fail", "{}")))
    first = loop.next_call()
    loop.always(first)
    assert conversation.tools.always == {"test/echo"}
    assert not loop.asks(loop.next_call()) and loop.asks(loop.next_call())


def test_stop_answers_every_unfinished_call_and_cuts_the_running_one(servers, tmp_path):
    loop = ready_loop(servers)
    loop.tool_use()
    loop.answered(tuple(ToolCall(f"c{i}", "hang", "{}") for i in range(4)))
    running, asking = loop.next_call(), loop.next_call()
    loop.running, loop.asking = running, asking
    posted = []
    worker = threading.Thread(target=loop.run, args=(running, posted.append))
    worker.start()
    while calls_made(tmp_path / "calls.txt") != ["hang"]:
        worker.join(0.05)
    answered = loop.stop()
    worker.join(5)
    assert not worker.is_alive() and loop.stopped and loop.cancel.is_set()
    assert [(p.call.id, r.status) for p, r in answered] == [
        ("c0", CANCELLED),
        ("c1", CANCELLED),
        ("c2", CANCELLED),
        ("c3", CANCELLED),
    ]
    assert answered[0][1].text.startswith("Stopped: the user stopped the answer while this call ran")
    assert answered[1][1].text.startswith("Not run: the user stopped the answer")
    assert posted[0].result.status == CANCELLED  # what the cut call's worker posted: a second result, dropped
