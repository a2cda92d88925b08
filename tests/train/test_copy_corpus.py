"""The copy tasks: the block given in the request, the answer the whole block after exactly the edit asked
for, held-out tasks from held-out chats with held-out words, and tasks tokenized as the engine meets them."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from dflash_chat.train.copy_corpus import (
    MAX_CHARS,
    MAX_CODE_LINES,
    copy_conversation,
    copy_task,
    copy_tasks,
    heldout_copy_tasks,
    random_copy_tasks,
    source_block,
)
from dflash_chat.train.corpus import Conversation

CODE = '''def scaled(values, factor=2):
    """Each value times factor; 10 at most."""
    out = []
    for value in values:  # value stays a name in comments too
        out.append(min(10, value * factor))
    return out'''
PROSE = (
    "The with statement wraps the execution of a block with methods defined by a context manager. "
    "This allows common usage patterns to be encapsulated for reuse.\n\nA second paragraph."
)
WORDS = ["alpha", "beta", "gamma", "delta"]


def chat(answer: str) -> Conversation:
    return Conversation([{"role": "user", "content": "?"}, {"role": "assistant", "content": answer}])


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def unfenced(answer: str) -> str:
    assert answer.startswith("```python\n") and answer.endswith("\n```")
    return answer[len("```python\n") : -len("\n```")]


def tasks_of(kind: str, block: str, n: int = 200) -> list:
    rng = random.Random(0)
    return [copy_task(rng, kind, block, WORDS) for _ in range(n)]


def test_source_blocks_are_an_answers_code_or_its_first_long_paragraph():
    assert source_block(chat(fenced(CODE))) == ("code", CODE)
    long = "\n".join(f"x{i} = {i}" for i in range(40))
    kind, block = source_block(chat(fenced(long)))
    assert kind == "code" and block.splitlines() == long.splitlines()[:MAX_CODE_LINES]
    assert source_block(chat(PROSE)) == ("prose", PROSE.split("\n\n")[0])
    sentence = "A sentence that goes on for a while. "
    kind, cut = source_block(chat(sentence * 40))
    assert kind == "prose" and len(cut) <= MAX_CHARS and cut.endswith(".") and (sentence * 40).startswith(cut)
    assert source_block(chat("Too short.")) is None


def test_a_repeat_answers_the_block_given_exactly():
    repeats = [t for t in tasks_of("code", CODE) if t.edit == "repeat"]
    assert repeats
    for task in repeats:
        assert fenced(CODE) in task.request and task.answer == fenced(CODE)


def test_a_rename_changes_every_whole_word_use_of_a_code_name_and_nothing_else():
    renames = [t for t in tasks_of("code", CODE) if t.edit == "rename"]
    assert {re.search(r"`(\w+)` to", t.request)[1] for t in renames} >= {"values", "factor", "value", "out"}
    for task in renames:
        old, new = re.search(r"`(\w+)` to `(\w+)`", task.request).groups()
        assert old not in ("def", "for", "min", "return")  # keywords and builtins stay
        assert set(new.split("_")) <= set(WORDS)
        answer = unfenced(task.answer)
        assert re.sub(rf"\b{new}\b", old, answer) == CODE and not re.search(rf"\b{old}\b", answer)
    value = next(t for t in renames if "`value` to" in t.request)
    new = re.search(r"to `(\w+)`", value.request)[1]
    assert f"{new} stays a name in comments too" in value.answer and "values" in value.answer  # whole words only


def test_a_reindent_changes_only_the_indent():
    reindents = [t for t in tasks_of("code", CODE) if t.edit == "reindent"]
    assert {int(re.search(r"(\d) spaces", t.request)[1]) for t in reindents} == {2, 8}
    for task in reindents:
        width = int(re.search(r"(\d) spaces", task.request)[1])
        for given, answered in zip(CODE.splitlines(), unfenced(task.answer).splitlines(), strict=True):
            assert given.strip() == answered.strip()
            assert len(answered) - len(answered.lstrip()) == (len(given) - len(given.lstrip())) // 4 * width


def test_a_value_change_replaces_every_use_of_one_integer_literal():
    changes = [t for t in tasks_of("code", CODE) if t.edit == "value"]
    assert changes
    for task in changes:
        old, new = re.search(r"(?:every|value) (\d+) (?:to|with) (\d+)", task.request).groups()
        assert old in ("2", "10") and new != old
        assert unfenced(task.answer) == re.sub(rf"(?<![\w.]){old}(?![\w.])", new, CODE)


def test_a_paragraph_is_repeated_or_has_one_word_replaced():
    paragraph = PROSE.split("\n\n")[0]
    tasks = tasks_of("prose", paragraph)
    assert Counter(t.edit for t in tasks).keys() == {"repeat", "rename"}
    for task in tasks:
        assert paragraph in task.request
        if task.edit == "repeat":
            assert task.answer == paragraph
        else:
            replaced = re.search(r"`(\w+)` with `(\w+)`", task.request)
            written = re.search(r"write `(\w+)` wherever it says `(\w+)`", task.request)
            old, new = replaced.groups() if replaced else written.groups()[::-1]
            assert re.sub(rf"\b{new}\b", old, task.answer) == paragraph and task.answer != paragraph


def test_training_and_held_out_tasks():
    conversations = [chat(fenced(CODE)), chat(PROSE), chat("Too short.")]
    tasks = copy_tasks(conversations, WORDS, 300, seed=0)
    assert len(tasks) == 300 and copy_tasks(conversations, WORDS, 300, seed=0) == tasks
    kinds = Counter(t.kind for t in tasks)
    assert 0.2 < kinds["prose"] / 300 < 0.4 and kinds["code"] > kinds["prose"]
    assert {t.edit for t in tasks} == {"repeat", "rename", "reindent", "value"}
    heldout = heldout_copy_tasks(conversations, ["omega"], 4)
    assert [t.source for t in heldout] == [CODE, PROSE.split("\n\n")[0]] * 2
    assert all(re.search(r"to `(\w+)`", t.request)[1] == "omega" for t in heldout if t.edit == "rename")
    assert copy_tasks([chat("Too short.")], WORDS, 5, seed=0) == []


def test_random_blocks_are_made_of_the_words_given_and_answered_whole():
    tasks = random_copy_tasks(WORDS, 200, seed=0)
    assert len(tasks) == 200 and random_copy_tasks(WORDS, 200, seed=0) == tasks
    assert {t.kind for t in tasks} == {"code", "prose"} and {t.edit for t in tasks} >= {"repeat", "rename"}
    for task in tasks:
        assert set(re.findall(r"[a-z]+", task.source)) <= set(WORDS) | {"if", "def", "for", "in", "return"}
        assert task.source in task.request
        if task.edit == "repeat":
            assert task.answer in (task.source, fenced(task.source))


def test_a_task_is_tokenized_with_the_answer_alone_labelled(demo_tokenizer):
    from dflash_chat.train.data import chat_tokens

    task = next(t for t in tasks_of("code", CODE) if t.edit == "rename")
    tokens = chat_tokens(demo_tokenizer, copy_conversation(task))
    assert demo_tokenizer.decode(tokens.ids[tokens.labels != -100]) == task.answer + "<|im_end|>"
    assert task.request in demo_tokenizer.decode(tokens.ids[tokens.labels == -100])


@pytest.fixture(scope="module")
def demo_tokenizer():
    from transformers import AutoTokenizer

    from dflash_chat.models.demo import demo_dir

    return AutoTokenizer.from_pretrained(demo_dir() / "target")
