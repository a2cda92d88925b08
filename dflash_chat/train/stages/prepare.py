"""The first stages: the corpus and its tokenizer (`prepare`), then the target; and the corpus file
they leave in the work folder for the later stages."""

from __future__ import annotations

import json
import time
from pathlib import Path

from dflash_chat.train.common import Log
from dflash_chat.train.corpus import Conversation, Corpus, build_corpus
from dflash_chat.train.target import TargetShape, TrainSettings, new_target, save_target, train_target
from dflash_chat.train.tokenizer import save_tokenizer, train_tokenizer


def prepare(work: Path, *, seed: int, vocab_size: int = 6144, max_files: int | None = None, log: Log = print) -> None:
    started = time.perf_counter()
    corpus = build_corpus(seed=seed, max_files=max_files)
    save_corpus(corpus, work / "corpus.json")
    texts = [m["content"] for c in corpus.train for m in c.messages]
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    save_tokenizer(tokenizer, work / "tokenizer")
    log(
        f"prepared {len(corpus.train)} training chats, {len(corpus.heldout)} held out, "
        f"vocab {len(tokenizer)} ({time.perf_counter() - started:.0f}s)"
    )


def train_target_stage(
    work: Path,
    *,
    seed: int,
    steps: int,
    device: str,
    shape: TargetShape | None = None,
    settings: TrainSettings | None = None,
    log: Log = print,
) -> list[float]:
    from transformers import AutoTokenizer

    from dflash_chat.train.data import packed_tokens

    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    corpus = load_corpus(work / "corpus.json")
    tokens = packed_tokens(tokenizer, corpus.train)
    model = new_target(shape or TargetShape(), tokenizer, seed)
    settings = settings or TrainSettings(steps=steps)
    settings.steps = steps
    log(
        f"target: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {len(tokens)} training tokens, "
        f"{steps} steps of {settings.batch_size}x{settings.seq_len} on {device}"
    )
    losses = train_target(model, tokens, settings, seed=seed, device=device, log=log)
    save_target(model, tokenizer, work / "target")
    return losses


def save_corpus(corpus: Corpus, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        split: [
            {
                "messages": c.messages,
                "reasoning": c.reasoning,
                "tags": sorted(c.tags),
                "subject": c.subject,
                "summary": c.summary,
            }
            for c in convs
        ]
        for split, convs in (("train", corpus.train), ("heldout", corpus.heldout))
    }
    path.write_text(json.dumps(data))


def load_corpus(path: Path) -> Corpus:
    data = json.loads(path.read_text())

    def convs(rows):
        return [
            Conversation(
                r["messages"],
                r["reasoning"],
                set(r["tags"]),
                tuple(r["subject"]) if r.get("subject") else None,
                r.get("summary"),
            )
            for r in rows
        ]

    return Corpus(train=convs(data["train"]), heldout=convs(data["heldout"]))
