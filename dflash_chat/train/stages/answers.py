"""The target's answers the drafter stages train and check on, and the shipped drafter a later stage
trains further beside them."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from dflash_chat.train.common import Log
from dflash_chat.train.corpus import Conversation, free_form_prompts
from dflash_chat.train.drafter import Sequence, load_for_training
from dflash_chat.train.stages.prepare import load_corpus

HELD_OUT = 32  # held-out prompts the stages check on
TOOL_SEED_OFFSET = 1000  # the tool chats answered for a drafter: other than those the target trained on (same seed)


@dataclass(frozen=True)
class AnswerSettings:
    """Which prompts the target answers for a drafter stage, and how."""

    generated: int  # training prompts
    max_new_tokens: int = 160
    gen_batch: int = 64
    free_share: float = 0.5  # of the prompts asked in other words (corpus.free_form_prompts)
    sampled_share: float = 0.0  # of the answers drawn at the app's sampling settings, the rest greedy
    tool_share: float = 0.0  # of the prompts tool chats (train/tool_corpus.py): half calls, half after a result


class Answers(NamedTuple):
    """The target's answers a drafter stage trains and checks on."""

    own: list[Sequence]  # to training prompts: greedy, and drawn at the app's settings for a share of them
    held: list[Sequence]  # greedy, to the first HELD_OUT held-out prompts
    held_sampled: list[Sequence]  # drawn at the app's settings, to the same prompts (empty without a share)


class Shipped(NamedTuple):
    """A shipped drafter loaded to train further, with its target and the target's answers."""

    target: Any
    answers: Answers
    drafter: Any
    config: dict


def target_and_answers(
    work: Path, target_dir: Path, answering: AnswerSettings, *, seed: int, device: str, log: Log
) -> tuple[Any, Any, Answers]:
    """(tokenizer, target, `Answers`) for a drafter stage: the target as shipped (bf16 weights), upcast
    like the loader does on the CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    target.to(device)  # type: ignore[arg-type]  # transformers types `to`'s wrapper, not the model's
    return tokenizer, target, _target_answers(work, target, tokenizer, answering, seed=seed, device=device, log=log)


def shipped_drafter(
    work: Path, source: Path, target_dir: Path, answering: AnswerSettings, *, seed: int, device: str, log: Log
) -> Shipped:
    """The drafter shipped in `source` (DFlash or DFlash2), loaded for training against the target in
    `target_dir`, with that target's answers."""
    _, target, answers = target_and_answers(work, target_dir, answering, seed=seed, device=device, log=log)
    drafter, config = load_for_training(source, target)
    return Shipped(target, answers, drafter, config)


def _target_answers(
    work: Path, target, tokenizer, answering: AnswerSettings, *, seed: int, device: str, log: Log
) -> Answers:
    """The target's answers to `answering.generated` training prompts (a `sampled_share` of them drawn at
    the app's sampling settings, the rest greedy) and to HELD_OUT held-out ones: a drafter's data."""
    from dflash_chat.train.data import Sampled, target_answers

    corpus = load_corpus(work / "corpus.json")
    rng = random.Random(seed)
    free = round(answering.free_share * answering.generated)
    tools = round(answering.tool_share * answering.generated)
    prompts = rng.sample(corpus.train, min(answering.generated - free - tools, len(corpus.train)))
    prompts += free_form_prompts(corpus.train, rng, free)
    prompts += tool_prompts(tools, seed)
    rng.shuffle(prompts)
    drawn = round(answering.sampled_share * len(prompts))
    started = time.perf_counter()

    def answers(prompts: list[Conversation], sampled: Sampled | None = None, thinking_share: float = 0.2):
        return target_answers(
            target,
            tokenizer,
            prompts,
            max_new_tokens=answering.max_new_tokens,
            thinking_share=thinking_share,
            batch_size=answering.gen_batch,
            seed=seed,
            device=device,
            sampled=sampled,
        )

    own = answers(prompts[drawn:])
    held = answers(corpus.heldout[:HELD_OUT], thinking_share=0.0)
    held_sampled: list[Sequence] = []
    if drawn:
        app = app_sampling()
        own += answers(prompts[:drawn], app)
        held_sampled = answers(corpus.heldout[:HELD_OUT], app, thinking_share=0.0)
    log(
        f"drafter data: {len(own)} target answers, {drawn} of them sampled, {tools} to tool chats ({sum(len(q.ids) for q in own)} tokens, "
        f"{time.perf_counter() - started:.0f}s)"
    )
    return Answers(own, held, held_sampled)


def tool_prompts(count: int, seed: int) -> list[Conversation]:
    """`count` tool chats of the training words (train/tool_corpus.py) for the target to answer: every other
    one its request (the target answers with a call), the others after the call's result (it answers in text)."""
    from dflash_chat.train.tool_corpus import call_conversation, result_conversation, training_chats, word_pools

    if not count:
        return []
    chats = training_chats(word_pools(), count, seed + TOOL_SEED_OFFSET)
    return [result_conversation(c) if i % 2 else call_conversation(c) for i, c in enumerate(chats)]


def app_sampling():
    """The app's default sampling settings (settings.py), as the target's answers are drawn with them."""
    from dflash_chat.settings import Settings
    from dflash_chat.train.data import Sampled

    app = Settings()
    return Sampled(app.temperature, app.top_p, app.top_k)
