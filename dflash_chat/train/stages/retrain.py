"""The retrain stage: the shipped demo target trained further, on this machine's CPU, to call tools and to
copy, with the corpus it first trained on beside them so that its prose and code answers keep their quality.

Each step takes `tool_batch` tool chats (as the tools stage makes them: names from the training half of the
word pools, results quoted in the answers after them, questions no tool fits), `copy_batch` copy tasks
(train/copy_corpus.py), `window_batch` windows of the packed corpus and `induction_batch` induction runs (a run of
corpus tokens drawn at random, then the same run again); the step's loss is the four losses added. The runs are
there because the copy tasks alone did not teach copying: over 550 steps their held-out copy tokens stayed at
33-35 %, while the target, which had no induction at all (a repeated random run scored at chance), learnt to
repeat runs within about 150 steps of them (bench/results/train-issue46-induction-probe.json). Steps 0-550
of the run took no runs; they join from the checkpoint of step 550 on.

The run is resumable (train/resumable.py): its checkpoint and curve live in work/retrain/, so it goes in
chunks (`--max-target-minutes`), each started by the same command. Every `eval_every` steps the curve gets:
the corpus's held-out loss, and teacher-forced on held-out chats (tools named from the held-out words, code
the target never saw) the share of calls whose every token is ranked first and the share of their tokens,
the same for the answers that quote a tool's result and for copy tasks. When every step is taken the target
goes to work/target (for the ship stage; its MTP layer is not kept: train it again with the mtp stage)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from dflash_chat.models.demo import TOOL_PROMPTS_FILE
from dflash_chat.train.common import Log
from dflash_chat.train.resumable import Checkpointing, Draws, Progress, train_resumable
from dflash_chat.train.target import Chat, answer_batch, answer_hits, random_windows, save_target

RETRAIN_STEPS = 1200  # about 2.5 hours on one shared CPU core (7-8 s a step)
RETRAIN_LR = 1e-3  # below the tools stage's 1.5e-3: its 200 steps at 2e-3 took the corpus loss from 2.5 to 3
RETRAIN_WARMUP = 40
COPY_TASKS = 3000  # training copy tasks from the corpus's blocks
RANDOM_COPY_TASKS = 3000  # and from random words (train/copy_corpus.py: `random_copy_tasks`)
HELDOUT_COPIES = 32
HELDOUT_RESULTS = 16  # held-out one-call chats whose answer after the result is measured
HELDOUT_WINDOWS = 8  # of the held-out corpus's packed stream, for its loss


@dataclass
class RetrainSettings(Checkpointing):
    lr: float = RETRAIN_LR
    warmup: int = RETRAIN_WARMUP
    weight_decay: float = 0.1
    tool_batch: int = 4
    copy_batch: int = 8
    window_batch: int = 2
    induction_batch: int = 8
    induction_run: int = 48  # tokens in a run; the sequence is the run twice
    seq_len: int = 256
    log_every: int = 10
    save_seconds: float = 240.0
    eval_every: int = 50


class RetrainData(NamedTuple):
    tools: list[Chat]  # tool chats (calls, results, questions no tool fits)
    copies: list[Chat]
    tokens: torch.Tensor  # the corpus's training chats, packed
    heldout_calls: list[Chat]
    heldout_results: list[Chat]
    heldout_copies: list[Chat]
    heldout_windows: torch.Tensor  # [HELDOUT_WINDOWS, seq_len] of the held-out chats, packed


def retrain_stage(
    work: Path,
    *,
    source: Path,
    seed: int,
    steps: int,
    device: str,
    settings: RetrainSettings,
    tool_chats: int | None = None,
    copy_count: int = COPY_TASKS,
    random_count: int = RANDOM_COPY_TASKS,
    log: Log = print,
) -> Progress:
    """The target in `source` trained to `steps` steps (from work/retrain/checkpoint.pt when it is there),
    for one chunk; written to work/target once every step is taken."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_chat.train.stages.tools import TOOL_CHATS

    tokenizer = AutoTokenizer.from_pretrained(source)
    target = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    target.to(torch.device(device))  # type: ignore[arg-type]  # transformers types `to`'s wrapper, not the model's
    started = time.perf_counter()
    made = (seed, settings.seq_len, TOOL_CHATS if tool_chats is None else tool_chats, copy_count, random_count)
    data = cached_data(work / "retrain" / "data.pt", made, lambda: retrain_data(work, tokenizer, *made))
    log(
        f"retrain: {len(data.tools)} tool chats, {len(data.copies)} copy tasks, {len(data.tokens)} corpus tokens; "
        f"held out: {len(data.heldout_calls)} calls, {len(data.heldout_results)} results, "
        f"{len(data.heldout_copies)} copy tasks ({time.perf_counter() - started:.0f}s)"
    )
    settings.steps = steps
    settings.path = work / "retrain" / "checkpoint.pt"
    pad = tokenizer.pad_token_id
    step = retrain_step(target, data, settings, pad, device)
    progress = train_resumable(
        target, step, settings, seed=seed, evaluate=lambda: measure(target, data, pad, device), log=log
    )
    if progress.finished:
        save_target(target, tokenizer, work / "target")
        log(f"retrain: all {steps} steps taken; the target is in {work / 'target'}")
    return progress


def cached_data(path: Path, made: tuple, make) -> RetrainData:
    """The data `make()` returns, kept at `path` for the next chunk (tokenizing it takes minutes) with what
    it was `made` from; made again when that differs."""
    if path.exists():
        saved = torch.load(path, weights_only=False)
        if saved["made"] == made:
            return RetrainData(**saved["data"])
    data = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save({"made": made, "data": data._asdict()}, partial)
    partial.replace(path)
    return data


def retrain_data(
    work: Path, tokenizer, seed: int, seq_len: int, tool_chats: int, copy_count: int, random_count: int
) -> RetrainData:
    """The run's data from the corpus in `work` (the same for the same seed, so a resumed run draws from
    it as the first chunk did); writes the held-out tool chats to work/TOOL_PROMPTS_FILE."""
    from dflash_chat.train.copy_corpus import copy_conversation, copy_tasks, heldout_copy_tasks, random_copy_tasks
    from dflash_chat.train.data import chat_tokens, packed_tokens
    from dflash_chat.train.stages.prepare import load_corpus
    from dflash_chat.train.stages.tools import tool_sequences, write_heldout
    from dflash_chat.train.tool_corpus import call_conversation, names, result_conversation, word_pools

    corpus = load_corpus(work / "corpus.json")
    words = word_pools()
    heldout = write_heldout(work / TOOL_PROMPTS_FILE, words, corpus)
    tools = tool_sequences(tokenizer, corpus, words, tool_chats, seed, forbidden=names(heldout))
    tasks = copy_tasks(corpus.train, words.train, copy_count, seed) + random_copy_tasks(words.train, random_count, seed)
    copies = [chat_tokens(tokenizer, copy_conversation(t)) for t in tasks]
    calls = [c for c in heldout if c.call is not None]
    results = [c for c in calls if not c.more][:HELDOUT_RESULTS]
    held_copies = heldout_copy_tasks(corpus.heldout, words.heldout, HELDOUT_COPIES)
    stream = packed_tokens(tokenizer, corpus.heldout)
    count = min(HELDOUT_WINDOWS, len(stream) // seq_len)
    return RetrainData(
        tools,
        copies,
        packed_tokens(tokenizer, corpus.train),
        [chat_tokens(tokenizer, call_conversation(c)) for c in calls],
        [chat_tokens(tokenizer, result_conversation(c)) for c in results],
        [chat_tokens(tokenizer, copy_conversation(t)) for t in held_copies],
        stream[: count * seq_len].view(count, seq_len),
    )


def retrain_step(model, data: RetrainData, settings: RetrainSettings, pad_id: int, device: str):
    """The step function: the tool chats' loss (on their answers), the copy tasks' (on theirs) and the corpus
    windows' (on every token), added."""

    def step(_: int, draws: Draws):
        tools = [data.tools[i] for i in draws.rng.sample(range(len(data.tools)), settings.tool_batch)]
        copies = [data.copies[i] for i in draws.rng.sample(range(len(data.copies)), settings.copy_batch)]
        windows = random_windows(data.tokens, settings.window_batch, settings.seq_len, draws.gen).to(device)
        figures = {
            "tools": _answer_loss(model, tools, pad_id, device),
            "copy": _answer_loss(model, copies, pad_id, device),
            "text": model(input_ids=windows, labels=windows).loss,
        }
        if settings.induction_batch:
            ids, labels = induction_runs(data.tokens, settings.induction_batch, settings.induction_run, draws.gen)
            figures["induction"] = model(input_ids=ids.to(device), labels=labels.to(device)).loss
        return sum(figures.values()), {k: v.detach() for k, v in figures.items()}

    return step


def induction_runs(
    tokens: torch.Tensor, batch: int, run: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels) [batch, 2 * run]: runs of tokens drawn one by one from `tokens` (so with the corpus's
    frequencies, and no special token), each followed by itself again; labelled where the repeat can be read
    from the first run (its first token can not: nothing says where the repeat starts)."""
    picked = torch.randint(0, len(tokens), (batch, run), generator=gen)
    first = tokens[picked]
    ids = torch.cat([first, first], dim=1)
    labels = ids.clone()
    labels[:, : run + 1] = -100
    return ids, labels


def _answer_loss(model, chats: list[Chat], pad_id: int, device: str) -> torch.Tensor:
    ids, labels = answer_batch(chats, pad_id)
    return model(input_ids=ids.to(device), labels=labels.to(device)).loss


@torch.no_grad()
def measure(model, data: RetrainData, pad_id: int, device: str) -> dict[str, float]:
    """The curve's held-out figures: the corpus loss, and for calls, results and copies the teacher-forced
    share of whole answers right (`_right`) and of their tokens (`_tokens`)."""
    model.eval()
    windows = data.heldout_windows.to(device)
    figures = {"heldout_loss": float(model(input_ids=windows, labels=windows).loss)}
    for name, chats in (("call", data.heldout_calls), ("result", data.heldout_results), ("copy", data.heldout_copies)):
        hits = answer_hits(model, chats, pad_id, device)
        figures[f"{name}_right"] = hits.right_chats / max(1, hits.chats)
        figures[f"{name}_tokens"] = hits.right_tokens / max(1, hits.tokens)
    return figures
