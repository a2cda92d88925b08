"""The demo tokenizer's chat template (Qwen3.6's thinking behaviour) and the offline corpus."""

from __future__ import annotations

import pytest

from dflash_chat.train.corpus import build_corpus
from dflash_chat.train.tokenizer import render, save_tokenizer, train_tokenizer, training_text

SAMPLE = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "The with statement wraps a block with methods of a context manager.",
] * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(SAMPLE, vocab_size=400), out)
    return AutoTokenizer.from_pretrained(out)  # as the loader reads it back


USER = [{"role": "user", "content": "What does `with` do?"}]


def test_generation_prompt_thinks_by_default(tokenizer):
    assert render(tokenizer, USER, add_generation_prompt=True) == (
        "<|im_start|>user\nWhat does `with` do?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_generation_prompt_without_thinking_closes_an_empty_block(tokenizer):
    assert render(tokenizer, USER, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_history_drops_old_reasoning_and_keeps_the_last(tokenizer):
    chat = USER + [
        {"role": "assistant", "content": "<think>\nrecall\n</think>\n\nIt wraps a block."},
        {"role": "user", "content": "Thanks"},
    ]
    text = render(tokenizer, chat, add_generation_prompt=True)
    assert "recall" not in text
    assert "<|im_start|>assistant\nIt wraps a block.<|im_end|>\n<|im_start|>user\nThanks" in text
    last = render(tokenizer, chat[:2])
    assert last.endswith("<|im_start|>assistant\n<think>\nrecall\n</think>\n\nIt wraps a block.<|im_end|>\n")


def test_special_tokens_are_single_ids_and_think_tags_survive_decoding(tokenizer):
    for token in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<|mask|>"):
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == token
    text = "<|im_start|>assistant\n<think>\nok\n</think>\n\ndef f():\n    pass<|im_end|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nok\n</think>\n\ndef f():\n    pass"
    assert tokenizer.eos_token == "<|im_end|>"


def test_training_text_matches_the_inference_prompt(tokenizer):
    corpus = build_corpus(seed=0, heldout=2, max_files=6)
    with_thinking = next(c for c in corpus.train if c.reasoning)
    plain = next(c for c in corpus.train if not c.reasoning)
    for conv, thinking in ((with_thinking, True), (plain, False)):
        prompt = render(tokenizer, conv.prompt_messages, add_generation_prompt=True, enable_thinking=thinking)
        text = training_text(tokenizer, conv)
        assert text.startswith(prompt) and text.endswith(conv.answer + "<|im_end|>\n")
    assert f"{with_thinking.reasoning}\n</think>\n\n" in training_text(tokenizer, with_thinking)


def test_corpus_is_deterministic_and_holds_out_whole_items():
    a = build_corpus(seed=3, heldout=8, max_files=8)
    b = build_corpus(seed=3, heldout=8, max_files=8)
    c = build_corpus(seed=4, heldout=8, max_files=8)
    assert [x.messages for x in a.train] == [x.messages for x in b.train]
    assert [x.messages for x in a.train] != [x.messages for x in c.train]
    assert len(a.heldout) == 8
    held = {_subject(x.messages[0]["content"]) for x in a.heldout}
    trained = {_subject(m["content"]) for x in a.train for m in x.messages if m["role"] == "user"}
    assert len(held) == 8 and not held & trained
    assert any(x.reasoning for x in a.train) and any("<think>" not in x.answer for x in a.train)


def _subject(question: str) -> str:
    """`module.name` asked about, whichever phrasing the question uses."""
    parts = question.split("`")[1::2]
    if len(parts) == 2:
        return f"{parts[1]}.{parts[0]}"
    return parts[0] if parts else question


def test_free_form_prompts_ask_about_corpus_subjects_in_other_words():
    import random

    from dflash_chat.train.corpus import free_form_prompts

    corpus = build_corpus(seed=0, heldout=2, max_files=10)
    a = free_form_prompts(corpus.train, random.Random(1), 20)
    b = free_form_prompts(corpus.train, random.Random(1), 20)
    questions = [c.prompt_messages[-1]["content"] for c in a]
    assert questions == [c.prompt_messages[-1]["content"] for c in b]
    corpus_questions = {m["content"] for c in corpus.train for m in c.messages if m["role"] == "user"}
    assert len(questions) == 20 and not set(questions) & corpus_questions
    assert all("{" not in q for q in questions)


def test_free_form_prompts_name_modules_as_modules_and_objects_as_objects():
    import random

    from dflash_chat.train.corpus import free_form_prompts, stdlib_items

    items = stdlib_items(max_files=10)
    modules = {i.module for i in items}
    names = {i.name.split(".")[-1] for i in items}
    corpus = build_corpus(seed=0, heldout=2, max_files=10)
    for conv in free_form_prompts(corpus.train, random.Random(2), 300):
        question = conv.prompt_messages[-1]["content"]
        quoted = question.split("`")[1::2]
        if question.startswith("How do I use"):
            assert quoted[0] in modules, question
        elif question.startswith("Give an example of"):
            module, name = quoted[0].rsplit(".", 1)
            assert module in modules and name in names, question
        elif question.startswith(("What is", "Write a class like")):
            assert quoted[0] in names, question


def test_saved_corpus_keeps_what_free_form_prompts_need(tmp_path):
    from dflash_chat.train.stages.prepare import load_corpus, save_corpus

    corpus = build_corpus(seed=0, heldout=2, max_files=10)
    save_corpus(corpus, tmp_path / "corpus.json")
    loaded = load_corpus(tmp_path / "corpus.json")
    assert [(c.subject, c.summary) for c in loaded.train] == [(c.subject, c.summary) for c in corpus.train]
    assert any(c.summary for c in loaded.train) and all(c.subject for c in loaded.heldout)
