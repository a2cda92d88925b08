"""A branch reuses the shared system prompt through every dialect: a second request with the same system prompt
and another user message resumes from the engine's checkpoint at the end of the system block
(engine/prefix_cache.py), and each dialect's usage says how many prompt tokens it reused."""

from __future__ import annotations

import pytest

from dflash_chat.runtime.endpoint import httpx_module

from .conftest import serving

httpx = httpx_module()

# about 300 tokens of system prompt, the same for both requests of a dialect (and different between dialects, so
# each dialect's first request starts cold)
SYSTEM = "You are a careful coding assistant. Answer in one short sentence. " * 20


@pytest.fixture(scope="module")
def server(demo_pair):
    with serving(demo_pair) as running:
        yield running


def _chat(url: str, system: str, user: str) -> tuple[int, int]:
    body = {
        "model": "dflash-chat-demo",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "temperature": 0,
    }
    usage = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).raise_for_status().json()["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


def _messages(url: str, system: str, user: str) -> tuple[int, int]:
    body = {
        "model": "dflash-chat-demo",
        "system": system,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": 4,
        "temperature": 0,
    }
    usage = httpx.post(f"{url}/v1/messages", json=body, timeout=120).raise_for_status().json()["usage"]
    return usage["cache_read_input_tokens"], usage["input_tokens"] + usage["cache_read_input_tokens"]


def _responses(url: str, system: str, user: str) -> tuple[int, int]:
    body = {
        "model": "dflash-chat-demo",
        "instructions": system,
        "input": user,
        "max_output_tokens": 16,
        "temperature": 0,
    }
    usage = httpx.post(f"{url}/v1/responses", json=body, timeout=120).raise_for_status().json()["usage"]
    return usage["input_tokens_details"]["cached_tokens"], usage["input_tokens"]


@pytest.mark.parametrize("ask", [_chat, _messages, _responses], ids=["chat", "messages", "responses"])
def test_a_branch_from_the_same_system_prompt_reuses_it(server, ask):
    _, url = server
    system = f"[{ask.__name__}] {SYSTEM}"
    cached, prompt = ask(url, system, "How do I reverse a list in Python?")
    assert cached < 10  # this system prompt is new: at most the template's first tokens were held
    system_tokens = prompt - 40  # the system block is all of the prompt but the user turn and the generation prompt
    cached, prompt = ask(url, system, "What does a dict comprehension look like?")
    assert system_tokens < cached < prompt


def test_two_conversations_at_once_each_resume_where_they_left_off(server):
    """Two chats (or an agent's side requests with a system prompt of their own) take turns: each comes back to
    its own state, parked in host memory while the other held the model (engine/parked.py)."""
    _, url = server

    def turn(system: str, history: list[dict], user: str) -> tuple[int, int]:
        history.append({"role": "user", "content": user})
        body = {"model": "dflash-chat-demo", "messages": [{"role": "system", "content": system}, *history]}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body | {"max_tokens": 4, "temperature": 0}, timeout=120)
        answer = reply.raise_for_status().json()
        history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        return answer["usage"]["prompt_tokens_details"]["cached_tokens"], answer["usage"]["prompt_tokens"]

    first, second = [], []
    cached_a, prompt_a = turn(f"[first] {SYSTEM}{SYSTEM}", first, "How do I sort a dict by value?")
    cached_b, prompt_b = turn(f"[second] {SYSTEM}{SYSTEM}", second, "How do I read a CSV file?")
    assert cached_a < 10 and cached_b < 10 and min(prompt_a, prompt_b) > 512  # long enough to be parked
    cached, _ = turn(f"[first] {SYSTEM}{SYSTEM}", first, "And in reverse order?")
    # all its first prompt but where the template renders the answer otherwise than it was generated (the
    # system block's end, or the whole first turn): the second chat shares nothing with it, and without the
    # parked state this would be a cold prefill
    assert cached > prompt_a - 40
    cached, _ = turn(f"[second] {SYSTEM}{SYSTEM}", second, "And write one?")
    assert cached > prompt_b - 40


def test_a_parked_conversation_without_a_system_prompt_comes_back(server):
    """With no system prompt there is no checkpoint before the first answer: the next turn of a parked
    conversation comes back only when it is built, as the held one's is, as an exact continuation of its tokens
    (the empty think block its first prompt ended with kept), and then it reuses all its first prompt."""
    _, url = server

    def turn(history: list[dict], user: str) -> tuple[int, int]:
        history.append({"role": "user", "content": user})
        body = {"model": "dflash-chat-demo", "messages": history, "max_tokens": 4, "temperature": 0}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).raise_for_status().json()
        history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        return answer["usage"]["prompt_tokens_details"]["cached_tokens"], answer["usage"]["prompt_tokens"]

    first, second = [], []
    _, prompt_a = turn(first, f"[first] {SYSTEM}{SYSTEM} How do I sort a dict by value?")
    _, prompt_b = turn(second, f"[second] {SYSTEM}{SYSTEM} How do I read a CSV file?")
    assert min(prompt_a, prompt_b) > 512  # long enough to be parked
    cached, _ = turn(first, "And in reverse order?")
    assert cached >= prompt_a
    cached, _ = turn(second, "And write one?")
    assert cached >= prompt_b
