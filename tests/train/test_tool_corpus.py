"""The synthetic tool chats: held-out names never trained on, calls that parse back to their values and types,
answers that quote the result, and chats tokenized as the engine meets them."""

from __future__ import annotations

import json

import pytest

from dflash_chat.runtime.tool_calls import parse_calls, render_call
from dflash_chat.train.corpus import Conversation
from dflash_chat.train.tool_checks import answered_in_text, judge_call, quotes_result, schema_errors
from dflash_chat.train.tool_corpus import (
    Call,
    calls_text,
    chat_of_record,
    chat_record,
    heldout_chats,
    is_heldout_word,
    names,
    no_tool_chat,
    result_values,
    training_chats,
    word_pools,
)

QUESTION = Conversation(
    [
        {"role": "user", "content": "Show the function `dedent` from module `textwrap`."},
        {"role": "assistant", "content": "```python\ndef dedent(text):\n    pass\n```"},
    ]
)


@pytest.fixture(scope="module")
def words():
    return word_pools(max_files=120)


@pytest.fixture(scope="module")
def chats(words):
    return training_chats(words, 400, seed=0)


def test_the_word_pools_split_by_hash(words):
    assert len(words.train) > 100 and len(words.heldout) > 20
    assert not set(words.train) & set(words.heldout)
    assert all(is_heldout_word(w) for w in words.heldout) and not any(is_heldout_word(w) for w in words.train)


def test_held_out_names_never_appear_in_training_chats(words):
    heldout = names(heldout_chats(words, 48))
    for seed in (0, 1, 2, 5):
        trained = names(training_chats(words, 600, seed))
        assert len(trained) > 500 and not trained & heldout
    # every held-out tool name is made of held-out words after its verb
    for chat in heldout_chats(words, 48):
        for tool in chat.tools:
            assert all(w in words.heldout for w in tool.name.split("_")[1:])


def test_the_same_seed_gives_the_same_chats(words, chats):
    assert training_chats(words, 400, seed=0) == chats
    assert training_chats(words, 400, seed=1) != chats
    assert heldout_chats(words, 8) == heldout_chats(words, 8)


def test_chats_offer_one_to_three_tools_of_one_to_three_parameters_of_every_type(chats):
    kinds = set()
    for chat in chats:
        assert 1 <= len(chat.tools) <= 3 and len({t.name for t in chat.tools}) == len(chat.tools)
        assert chat.call is not None and chat.call.name in {t.name for t in chat.tools}
        for tool in chat.tools:
            properties = tool.parameters["properties"]
            assert 1 <= len(properties) <= 3 and set(tool.parameters["required"]) <= set(properties)
            kinds |= {"enum" if "enum" in p else p["type"] for p in properties.values()}
    assert kinds == {"string", "integer", "number", "boolean", "enum"}
    optional_left_out = sum(
        len(next(t for t in c.tools if t.name == c.call.name).parameters["properties"]) > len(c.call.arguments)
        for c in chats
    )
    assert optional_left_out > 20  # some requests leave optional parameters out


def test_calls_parse_back_to_their_values_with_the_schemas_types(chats):
    for chat in chats:
        content, calls = parse_calls(calls_text(chat.calls), chat.tools)
        assert content == "" and [c.name for c in calls] == [c.name for c in chat.calls]
        for made, asked in zip(calls, chat.calls, strict=True):
            args = made.args()
            assert args == asked.arguments
            assert [type(v) for v in args.values()] == [type(v) for v in asked.arguments.values()]
            tool = next(t for t in chat.tools if t.name == asked.name)
            assert schema_errors(tool.parameters, args) == []
        assert judge_call(calls_text(chat.calls), chat).exact


def test_some_requests_ask_for_two_calls_and_only_both_in_order_are_right(chats):
    two = [c for c in chats if c.more]
    assert 0.05 * len(chats) < len(two) < 0.3 * len(chats)
    for chat in two:
        assert len(chat.calls) == 2 and chat.calls[0].name != chat.calls[1].name
        assert all(c.name in {t.name for t in chat.tools} for c in chat.calls)
        assert not judge_call(render_call(*chat.call), chat).right_tool  # one of the two is not enough
        assert not judge_call(calls_text(chat.calls[::-1]), chat).right_tool


def test_the_request_names_the_tool_and_every_value(chats):
    for chat in chats:
        verb, _, rest = chat.call.name.replace("_", " ").partition(" ")
        assert chat.intent in (f"{verb} {rest}", f"{verb} the {rest}")
        assert chat.intent in chat.request or chat.intent[0].upper() + chat.intent[1:] in chat.request
        for call in chat.calls:
            for value in call.arguments.values():
                said = value if isinstance(value, str) else json.dumps(value)
                assert said in chat.request


def test_answers_after_the_result_quote_it(chats):
    for chat in chats:
        assert result_values(chat.result) and quotes_result(chat.answer, chat)
        assert not quotes_result("I do not know.", chat)


def test_schema_errors_name_what_is_wrong():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "mode": {"type": "string", "enum": ["a", "b"]},
        },
        "required": ["n"],
    }
    assert schema_errors(schema, {"n": 3, "x": 2, "mode": "a"}) == []
    assert schema_errors(schema, {"x": 1.5}) == ["missing 'n'"]
    assert schema_errors(schema, {"n": True}) == ["'n': True is not integer"]
    assert schema_errors(schema, {"n": 1.5, "mode": "c", "y": 1}) == [
        "'n': 1.5 is not integer",
        "'mode': 'c' is not ['a', 'b']",
        "unknown 'y'",
    ]


def test_a_wrong_tool_or_a_text_answer_is_not_a_right_call(chats):
    chat = next(c for c in chats if len(c.tools) > 1 and not c.more)
    other = next(t for t in chat.tools if t.name != chat.call.name)
    assert not judge_call(render_call(other.name, chat.call.arguments), chat).right_tool
    assert judge_call("I cannot.", chat).calls == 0
    assert not judge_call(render_call(chat.call.name, {"nope": 1}), chat).valid
    assert answered_in_text("I cannot.", chat) and not answered_in_text(render_call(*chat.call), chat)


def test_held_out_chats_survive_their_record(words):
    chats = heldout_chats(words, 40, [QUESTION])
    assert any(c.more for c in chats)
    assert chats[-1].call is None and chats[-1].request == QUESTION.messages[0]["content"]
    back = [chat_of_record(json.loads(json.dumps(chat_record(c)))) for c in chats]
    assert [(c.tools, c.request, c.call, c.more, c.result) for c in back] == [
        (c.tools, c.request, c.call, c.more, c.result) for c in chats
    ]
    assert isinstance(back[0].call, Call)


def test_a_question_no_tool_fits_is_answered_as_the_corpus_does(words):
    import random

    chat = no_tool_chat(random.Random(0), words.train, QUESTION)
    assert chat.call is None and chat.answer == QUESTION.answer and 1 <= len(chat.tools) <= 3


def test_chats_are_tokenized_as_the_engine_meets_them(chats):
    """A chat with a result is one sequence: its ids are the prompt of the answer after the result as the app
    tokenizes it, then that answer; the labels are the call and the answer (each with its end token)."""
    from transformers import AutoTokenizer

    from dflash_chat.models.demo import demo_dir
    from dflash_chat.runtime.prompt import build_prompt
    from dflash_chat.runtime.tool_use import ToolUse
    from dflash_chat.train.data import chat_tokens
    from dflash_chat.train.tool_corpus import call_conversation, result_conversation, result_turns

    tokenizer = AutoTokenizer.from_pretrained(demo_dir() / "target")
    for chat in [c for c in chats if not c.more][:20]:
        ids, labels = chat_tokens(tokenizer, result_conversation(chat))
        prompt = build_prompt(tokenizer, result_turns(chat), thinking=False, tool_use=ToolUse(chat.tools)).ids
        assert ids[: len(prompt)].tolist() == prompt
        said = tokenizer.decode(ids[labels != -100])
        assert said == render_call(*chat.call) + "<|im_end|>" + chat.answer + "<|im_end|>"
    thinking = next(c for c in chats if c.reasoning)
    ids, labels = chat_tokens(tokenizer, call_conversation(thinking))
    prompt = build_prompt(
        tokenizer, [{"role": "user", "content": thinking.request}], thinking=True, tool_use=ToolUse(thinking.tools)
    ).ids
    assert ids[: len(prompt)].tolist() == prompt and (labels[: len(prompt)] == -100).all()
    said = tokenizer.decode(ids[labels != -100])
    assert said == f"{thinking.reasoning}\n</think>\n\n{calls_text(thinking.calls)}<|im_end|>"


def test_answers_right_counts_teacher_forced_tokens_and_whole_answers():
    """On answers' labels alone: the share of tokens ranked first, and of answers whose every token is."""
    from types import SimpleNamespace

    import torch

    from dflash_chat.train.target import Chat, answers_right

    class NextButEight:
        """Ranks first the token that comes next, except 8 (it ranks 0 first there)."""

        def eval(self):
            return self

        def __call__(self, input_ids):
            nxt = torch.roll(input_ids, -1, dims=1)
            nxt[nxt == 8] = 0
            return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, 10).float())

    chats = [
        Chat(torch.tensor([5, 6, 7, 8]), torch.tensor([-100, -100, 7, 8])),
        Chat(torch.tensor([5, 6, 7]), torch.tensor([-100, 6, 7])),
    ]
    assert answers_right(NextButEight(), chats, pad_id=0) == (0.75, 0.5)
