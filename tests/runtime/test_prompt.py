from __future__ import annotations

import random

import pytest

from dflash_chat.chat.conversation import Conversation, Message, title_from
from dflash_chat.engine.end_tokens import end_token_ids, token_id
from dflash_chat.errors import UserError
from dflash_chat.runtime.detokenize import IncrementalDecoder
from dflash_chat.runtime.prompt import ThinkingSplitter, build_prompt, render_prompt


def turns():
    conversation = Conversation(
        messages=[
            Message("user", "hello"),
            Message("assistant", "hi there", thinking="greet back"),
            Message("assistant", "", status="error"),
            Message("user", "what does the with statement do?"),
        ]
    )
    return conversation.chat_turns("be brief")


def test_chat_turns_drop_thinking_and_empty_answers():
    assert turns() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "what does the with statement do?"},
    ]


def test_thinking_flag_changes_the_prompt_tokens(tokenizer):
    on = build_prompt(tokenizer, turns(), thinking=True)
    off = build_prompt(tokenizer, turns(), thinking=False)
    close_id = tokenizer.convert_tokens_to_ids("</think>")
    assert on.ids != off.ids
    assert on.ids == off.ids[: len(on.ids)]  # same conversation, different generation prompt
    assert close_id in off.ids[len(on.ids) :] and close_id not in on.ids
    assert on.opens_thinking and not off.opens_thinking
    assert tokenizer.decode(off.ids) == off.text


def test_missing_chat_template_is_a_user_error(tokenizer):
    bare = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    bare.chat_template = None
    with pytest.raises(UserError, match="no chat template"):
        build_prompt(bare, turns(), thinking=False)


def test_end_token_ids(tokenizer):
    vocab = tokenizer.get_vocab()
    ends = {vocab["<|im_end|>"], vocab["<|endoftext|>"]}
    assert set(end_token_ids(tokenizer)) == ends
    assert set(end_token_ids(tokenizer, [7])) == ends | {7} and set(end_token_ids(tokenizer, 9)) == ends | {9}


def test_token_id_is_none_for_a_token_the_vocabulary_lacks(tokenizer):
    assert token_id(tokenizer, "<|im_end|>") == tokenizer.get_vocab()["<|im_end|>"]
    assert token_id(tokenizer, "<|no_such_token|>") is None


def test_render_then_encode_is_build_prompt(tokenizer):
    prompt = build_prompt(tokenizer, turns(), thinking=False)
    assert render_prompt(tokenizer, turns(), thinking=False) == prompt.text
    assert prompt.ids == tokenizer.encode(prompt.text, add_special_tokens=False)


def test_incremental_decoder_never_splits_characters(tokenizer):
    text = "Café naïve 東京 🙂 def hello(name): return 1"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 10
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    decoder = IncrementalDecoder(tokenizer, skip_ids=(stop,))
    pieces = [decoder.push([i]) for i in ids] + [decoder.push([stop]), decoder.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_incremental_decoder_in_blocks(tokenizer):
    text = "<think>\nhmm</think>\n\nThe quick brown fox 🙂"
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoder = IncrementalDecoder(tokenizer)
    out = "".join(decoder.push(ids[i : i + 3]) for i in range(0, len(ids), 3)) + decoder.flush()
    assert out == text


def split_all(text, thinking, sizes):
    splitter = ThinkingSplitter(thinking=thinking)
    think, answer, at = [], [], 0
    for size in sizes:
        t, a = splitter.feed(text[at : at + size])
        think.append(t)
        answer.append(a)
        at += size
    t, a = splitter.flush()
    return "".join(think) + t, "".join(answer) + a


@pytest.mark.parametrize(
    "text, thinking, expected",
    [
        ("<think>\nplan it</think>\n\nHello!", False, ("\nplan it", "Hello!")),
        ("plan it\n</think>\n\nHello!", True, ("plan it\n", "Hello!")),
        ("Hello, no tags", False, ("", "Hello, no tags")),
        ("Use <think> tags like </think> this", False, ("", "Use <think> tags like </think> this")),
        ("still thinking <thi", True, ("still thinking <thi", "")),
    ],
)
def test_splitter_is_independent_of_chunking(text, thinking, expected):
    rng = random.Random(0)
    assert split_all(text, thinking, [len(text)]) == expected
    assert split_all(text, thinking, [1] * len(text)) == expected
    for _ in range(20):
        sizes = [rng.randint(1, 5) for _ in range(len(text))]
        assert split_all(text, thinking, sizes) == expected


def test_title_from():
    assert title_from("  hello   world \nsecond line") == "hello world"
    long = "explain " * 20
    title = title_from(long)
    assert title.endswith("…") and len(title) <= 49 and " " not in title[-2:]
    assert title_from("   ") == "New chat"


def answered_transcript(tokenizer, answer, thinking_text="", stop=True):
    from dflash_chat.runtime.prompt import Transcript

    turns = [{"role": "user", "content": "hello"}]
    prompt = build_prompt(tokenizer, turns, thinking=False)
    ids = tokenizer.encode(answer, add_special_tokens=False)
    if stop:
        ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return Transcript(turns, prompt, ids, answer, thinking_text)


def test_next_turn_starts_with_what_the_engine_holds(tokenizer):
    from dflash_chat.runtime.prompt import next_prompt

    previous = answered_transcript(tokenizer, "Hi! How can I help?")
    turns = previous.turns + [
        {"role": "assistant", "content": previous.answer},
        {"role": "user", "content": "tell me more"},
    ]
    prompt = next_prompt(tokenizer, turns, thinking=False, previous=previous)
    assert prompt.ids[: len(previous.ids)] == previous.ids
    tail = tokenizer.decode(prompt.ids[len(previous.ids) :])
    assert tail == "\n<|im_start|>user\ntell me more<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    # an answer cut short (no stop token) gets its end-of-turn added
    cut = answered_transcript(tokenizer, "Hi! How can I help?", stop=False)
    tail = tokenizer.decode(next_prompt(tokenizer, turns, thinking=False, previous=cut).ids[len(cut.ids) :])
    assert tail.startswith("<|im_end|>\n<|im_start|>user\ntell me more")


def test_regenerate_sends_the_same_prompt_and_other_changes_rerender(tokenizer):
    from dflash_chat.runtime.prompt import next_prompt

    previous = answered_transcript(tokenizer, "Hi!")
    assert next_prompt(tokenizer, previous.turns, thinking=False, previous=previous) is previous.prompt
    toggled = next_prompt(tokenizer, previous.turns, thinking=True, previous=previous)
    assert toggled.ids == build_prompt(tokenizer, previous.turns, thinking=True).ids
    edited = (
        [{"role": "system", "content": "new system"}]
        + previous.turns
        + [{"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "more"}]
    )
    assert next_prompt(tokenizer, edited, thinking=False, previous=previous).ids == (
        build_prompt(tokenizer, edited, thinking=False).ids
    )


def test_answers_that_thought_are_rerendered(tokenizer):
    from dflash_chat.runtime.prompt import next_prompt

    previous = answered_transcript(tokenizer, "Hi!", thinking_text="greet")
    turns = previous.turns + [{"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "more"}]
    assert next_prompt(tokenizer, turns, thinking=False, previous=previous).ids == (
        build_prompt(tokenizer, turns, thinking=False).ids
    )


def test_incremental_decoder_matches_a_full_decode_on_byte_soup(tokenizer):
    """Random ids make invalid UTF-8 (what a random or confused model writes): streamed
    pieces in random block sizes still add up to exactly the full decode."""
    rng = random.Random(1)
    for _ in range(200):
        ids = [rng.randrange(len(tokenizer)) for _ in range(60)]
        decoder = IncrementalDecoder(tokenizer)
        pieces, at = [], 0
        while at < len(ids):
            size = rng.randint(1, 16)
            pieces.append(decoder.push(ids[at : at + size]))
            at += size
        assert "".join(pieces) + decoder.flush() == tokenizer.decode(ids, skip_special_tokens=False)


def test_tools_render_through_the_models_own_template_and_a_forced_call_opens_the_answer():
    """The demo's template (Qwen3.6's shape) lists the tools in the system turn and writes past calls and tool
    answers; a forced call's first words end the prompt, after a closed think block even with thinking on."""
    from transformers import AutoTokenizer

    from dflash_chat.models.demo import demo_dir
    from dflash_chat.runtime.prompt import Transcript, next_prompt
    from dflash_chat.runtime.tool_calls import ToolSpec, call_opening
    from dflash_chat.runtime.tool_use import ToolUse

    demo = AutoTokenizer.from_pretrained(demo_dir() / "target")
    spec = ToolSpec("get_weather", "Weather now", {"type": "object", "properties": {"city": {"type": "string"}}})
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    chat = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    auto = build_prompt(demo, chat, thinking=False, tool_use=ToolUse((spec,)))
    assert '<tools>\n{"name": "get_weather"' in auto.text and auto.tools == ("get_weather",)
    assert "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>" in auto.text
    assert "<tool_response>\nsunny\n</tool_response>" in auto.text and auto.opening == ""
    assert build_prompt(demo, chat, thinking=False, tool_use=ToolUse((spec,), "none")).text.count("<tools>") == 0
    for thinking in (False, True):
        forced = build_prompt(demo, chat, thinking=thinking, tool_use=ToolUse((spec,), "get_weather"))
        assert forced.text.endswith("</think>\n\n" + call_opening("get_weather")) and not forced.opens_thinking
        assert forced.ids == demo.encode(forced.text, add_special_tokens=False)
    # the same chat and tools again is the very same prompt; other tools render afresh
    again = next_prompt(
        demo, chat, thinking=False, previous=Transcript(chat, auto, [], "", ""), tool_use=ToolUse((spec,))
    )
    assert again is auto
    other = ToolSpec("get_time")
    assert next_prompt(
        demo, chat, thinking=False, previous=Transcript(chat, auto, [], "", ""), tool_use=ToolUse((other,))
    ).tools == ("get_time",)
