"""The demo run's sizes: batch sizes and data amounts per kind of device (`preset`), and how many target
and drafter steps fit a time budget."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dflash_chat.train.drafter import (
    DrafterSettings,
    DrafterShape,
    drafter_config_dict,
    new_drafter,
    teach_all,
    train_drafter,
)
from dflash_chat.train.stages.answers import AnswerSettings
from dflash_chat.train.stages.prepare import load_corpus
from dflash_chat.train.target import TargetShape, TrainSettings, new_target, train_target
from dflash_chat.train.tokenizer import MASK_TOKEN


@dataclass
class Preset:
    """Batch sizes and data amounts for one kind of device (step counts come from the budget)."""

    target: TrainSettings
    drafter: DrafterSettings
    answering: AnswerSettings  # the target's answers that are the drafter stages' data


def preset(device: str) -> Preset:
    if str(device).startswith("cuda"):
        return Preset(
            TrainSettings(steps=0, batch_size=32, seq_len=512, lr=2e-3, warmup=100, log_every=100),
            DrafterSettings(steps=0, seqs_per_step=16, anchors_per_seq=32, lr=1e-3, warmup=50, log_every=100),
            AnswerSettings(generated=3072, max_new_tokens=256, gen_batch=512),
        )
    return Preset(
        TrainSettings(steps=0, batch_size=8, seq_len=256, lr=2e-3, warmup=30, log_every=20),
        DrafterSettings(steps=0, seqs_per_step=4, anchors_per_seq=32, lr=1.5e-3, warmup=20, log_every=20),
        AnswerSettings(generated=1024, max_new_tokens=160, gen_batch=64),
    )


def calibrate_target_steps(
    work: Path, seconds: float, device: str, seed: int, settings: TrainSettings | None = None
) -> int:
    """How many target steps fit in `seconds`, timed on a throwaway model (the real run is then seeded)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    tokens = torch.randint(0, len(tokenizer), (1 << 16,))
    quiet = replace(settings or TrainSettings(steps=0), log_every=10**9, max_seconds=None)
    per_step = _time_steps(
        lambda n: train_target(
            new_target(TargetShape(), tokenizer, seed),
            tokens,
            replace(quiet, steps=n),
            seed=seed,
            device=device,
            log=lambda _: None,
        )
    )
    return max(10, int(seconds / per_step))


def calibrate_drafter_steps(
    work: Path, seconds: float, device: str, seed: int, settings: DrafterSettings | None = None
) -> int:
    """Drafter steps that fit in `seconds` after the target's answers are generated (about a fifth)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_chat.train.data import corpus_sequences

    tokenizer = AutoTokenizer.from_pretrained(work / "target")
    target = AutoModelForCausalLM.from_pretrained(work / "target", dtype=torch.float32)
    target.to(torch.device(device))  # type: ignore[arg-type]  # transformers types `to`'s wrapper, not the model's
    sequences = corpus_sequences(tokenizer, load_corpus(work / "corpus.json").train[:256])
    shape = DrafterShape()
    mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    assert isinstance(mask_id, int)  # one token in, one id out
    config = drafter_config_dict(shape, target.config, mask_id)
    taught = teach_all(target, sequences, shape.target_layer_ids, device)  # once: the timed runs share it
    quiet = replace(settings or DrafterSettings(steps=0), log_every=10**9, max_seconds=None)
    per_step = _time_steps(
        lambda n: train_drafter(
            new_drafter(config, target, seed),
            target,
            sequences,
            replace(quiet, steps=n),
            seed=seed,
            device=device,
            log=lambda _: None,
            taught=taught,
        )
    )
    return max(10, int(0.8 * seconds / per_step))


def _time_steps(run) -> float:
    """Seconds per step: after a warm-up run, time 2 and 6 steps and take the difference (start-up cancels)."""
    run(1)
    t0 = time.perf_counter()
    run(2)
    t1 = time.perf_counter()
    run(6)
    t2 = time.perf_counter()
    per_step = ((t2 - t1) - (t1 - t0)) / 4
    return per_step if per_step > 0 else (t2 - t1) / 6
