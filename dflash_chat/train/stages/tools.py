"""The tools stage: the shipped demo target trained further to call tools (train/tool_corpus.py), with the
corpus it first trained on beside it so that it keeps its answers; and the held-out tool chats that
`bench --tools` measures, written for the ship stage."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Set as AbstractSet
from pathlib import Path

import torch

from dflash_chat.models.demo import TOOL_PROMPTS_FILE
from dflash_chat.train.common import Log
from dflash_chat.train.corpus import Conversation, Corpus
from dflash_chat.train.stages.prepare import load_corpus
from dflash_chat.train.target import Chat, MixedSettings, TrainSettings, save_target, train_target_mixed
from dflash_chat.train.tool_corpus import (
    Words,
    call_conversation,
    chat_record,
    heldout_chats,
    names,
    no_tool_chat,
    result_conversation,
    training_chats,
    word_pools,
)

TOOLS_STEPS = 600
TOOLS_LR = 1.5e-3  # below the target's first training (2e-3): the corpus windows beside the chats hold what it knew
TOOLS_WARMUP = 20
CHAT_BATCH = 8  # whole tool chats a step, beside half the target stage's batch of corpus windows
TOOL_CHATS = 4000  # training chats with a call
RESULT_SHARE = 0.5  # of them, also trained on the tool's result and the answer after it
NO_TOOL_SHARE = 0.2  # corpus questions with tools offered, answered in text: this share of the calls' count
NO_TOOL_TOKENS = 48  # of their answers trained on: enough to start in text, not with a call
HELDOUT_CALLS = 48  # held-out chats with a call
HELDOUT_NO_TOOL = 16  # held-out corpus questions with tools offered
CHECKED = 16  # held-out chat answers compared before and after, and held-out turns of each class checked
CHECK_TOKENS = 48
CHECK_EVERY = 25  # steps between the teacher-forced checks on held-out calls while training


def tools_settings(target: TrainSettings) -> MixedSettings:
    """The tools stage's settings from the target stage's (`target`, the device's preset): its window length,
    half its batch of windows, CHAT_BATCH chats, TOOLS_LR."""
    fields = {**vars(target), "lr": TOOLS_LR, "warmup": TOOLS_WARMUP, "batch_size": max(1, target.batch_size // 2)}
    return MixedSettings(**fields, chat_batch=CHAT_BATCH)


def tools_stage(
    work: Path,
    *,
    source: Path,
    seed: int,
    steps: int,
    device: str,
    settings: MixedSettings,
    chats: int = TOOL_CHATS,
    checked: int = CHECKED,
    log: Log = print,
) -> list[float]:
    """The target in `source` trained on `chats` tool chats (and their share of results and of corpus
    questions no tool fits) beside its corpus; written to work/target, with the held-out tool chats in
    work/TOOL_PROMPTS_FILE. Logs how many of `checked` held-out chat answers stayed the same, and the
    bench's checks on `checked` held-out turns of each tool class; while training, every CHECK_EVERY steps,
    how much of `checked` held-out calls it predicts teacher-forced."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_chat.train.data import chat_tokens, packed_tokens

    tokenizer = AutoTokenizer.from_pretrained(source)
    target = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    corpus = load_corpus(work / "corpus.json")
    words = word_pools()
    heldout = write_heldout(work / TOOL_PROMPTS_FILE, words, corpus)
    started = time.perf_counter()
    sequences = tool_sequences(tokenizer, corpus, words, chats, seed, forbidden=names(heldout))
    tokens = packed_tokens(tokenizer, corpus.train)
    log(
        f"tools: {len(sequences)} tool chats ({sum(len(s.ids) for s in sequences)} tokens) beside {len(tokens)} "
        f"corpus tokens, {len(words.train)} words for names, {len(words.heldout)} held out "
        f"({time.perf_counter() - started:.0f}s)"
    )
    questions = corpus.heldout[:checked]
    before = greedy_answers(target, tokenizer, questions, device)
    settings.steps = steps
    calls = [chat_tokens(tokenizer, call_conversation(c)) for c in heldout if c.call is not None][:checked]
    losses = train_target_mixed(
        target,
        sequences,
        tokens,
        settings,
        pad_id=tokenizer.pad_token_id,
        seed=seed,
        device=device,
        log=log,
        checked=calls,
        check_every=CHECK_EVERY,
    )
    same = sum(a == b for a, b in zip(before, greedy_answers(target, tokenizer, questions, device), strict=True))
    log(f"tools: held-out chat answers the same (greedy, {CHECK_TOKENS} tokens): {same} of {len(questions)}")
    save_target(target, tokenizer, work / "target")
    _log_heldout_checks(work / "target", work / TOOL_PROMPTS_FILE, checked, device, log)
    return losses


def tool_sequences(
    tokenizer, corpus: Corpus, words: Words, count: int, seed: int, *, forbidden: AbstractSet[str] = frozenset()
) -> list[Chat]:
    """`count` tool chats, each answered with its calls and, for a RESULT_SHARE of those with one call, the
    tool's result and the answer that quotes it; and NO_TOOL_SHARE * count corpus questions with tools offered, answered
    in text (the first NO_TOOL_TOKENS tokens): as the engine meets them (data.chat_tokens). ValueError when
    a name is in `forbidden`."""
    from dflash_chat.train.data import chat_tokens

    chats = training_chats(words, count, seed)
    clash = names(chats) & forbidden
    if clash:
        raise ValueError(f"training tool names {sorted(clash)[:5]} are held out")
    rng = random.Random(seed)
    conversations = [
        result_conversation(c) if rng.random() < RESULT_SHARE and not c.more else call_conversation(c) for c in chats
    ]
    out = [chat_tokens(tokenizer, c) for c in conversations]
    questions = rng.sample(corpus.train, min(len(corpus.train), round(NO_TOOL_SHARE * count)))
    for question in questions:
        chat = chat_tokens(tokenizer, call_conversation(no_tool_chat(rng, words.train, question)))
        end = int((chat.labels == -100).sum()) + NO_TOOL_TOKENS  # the prompt, then the answer's start
        out.append(Chat(chat.ids[:end], chat.labels[:end]))
    return out


def write_heldout(path: Path, words: Words, corpus: Corpus) -> list:
    """The held-out tool chats (HELDOUT_CALLS with a call, then HELDOUT_NO_TOOL held-out corpus questions),
    written to `path` as `bench --tools` reads them."""
    from dflash_chat.train.tool_corpus import HELDOUT_SEED

    chats = heldout_chats(words, HELDOUT_CALLS, corpus.heldout[:HELDOUT_NO_TOOL])
    about = (
        "Held-out tool chats for `dflash-chat bench --tools`: tools named from words no training chat's names "
        f"use (train/tool_corpus.py, seed {HELDOUT_SEED}); call is what the request asks for (null: no tool "
        "fits, a held-out code question), result the tool's answer."
    )
    path.write_text(json.dumps({"about": about, "chats": [chat_record(c) for c in chats]}, indent=1) + "\n")
    return chats


@torch.no_grad()
def greedy_answers(target, tokenizer, conversations: list[Conversation], device: str) -> list[list[int]]:
    """The target's first CHECK_TOKENS greedy answer tokens to each conversation's prompt, thinking off."""
    from dflash_chat.train.data import prompt_ids

    target.to(device).eval()
    out = []
    for conversation in conversations:
        ids = torch.tensor([prompt_ids(tokenizer, conversation, False)], device=device)
        generated = target.generate(
            input_ids=ids, max_new_tokens=CHECK_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        out.append(generated[0, ids.shape[1] :].tolist())
    return out


def _log_heldout_checks(target_dir: Path, heldout: Path, checked: int, device: str, log: Log) -> None:
    """The bench's checks on `checked` held-out turns of each tool class, greedy, by the saved target."""
    from dflash_chat.train.tool_bench import right_shares
    from dflash_chat.train.tool_corpus import chat_of_record

    chats = [chat_of_record(r) for r in json.loads(heldout.read_text())["chats"]]
    shares = right_shares(target_dir, chats, checked, device=device)
    log("tools: held-out turns right (greedy): " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
