"""The drafter stages: a DFlash drafter trained from scratch against the new target, and the DFlash2
drafter grown from a shipped DFlash one."""

from __future__ import annotations

from pathlib import Path

from dflash_chat.train.common import Log
from dflash_chat.train.drafter import (
    DrafterSettings,
    DrafterShape,
    drafter_config_dict,
    new_drafter,
    save_drafter,
    teacher_forced_acceptance,
    train_drafter,
)
from dflash_chat.train.stages.answers import AnswerSettings, shipped_drafter, target_and_answers
from dflash_chat.train.tokenizer import MASK_TOKEN

DFLASH2_STEPS = 800  # the dflash2 stage's default (it starts from a trained drafter: no calibration run)
DFLASH2_LR = 7e-4  # gentler than training from scratch: the backbone is trained already
DRAFTER_ANSWERS = AnswerSettings(generated=2000, max_new_tokens=192)  # the drafter stage's without a preset


def train_drafter_stage(
    work: Path,
    *,
    seed: int,
    steps: int,
    device: str,
    answering: AnswerSettings = DRAFTER_ANSWERS,
    shape: DrafterShape | None = None,
    settings: DrafterSettings | None = None,
    log: Log = print,
) -> list[float]:
    tokenizer, target, answers = target_and_answers(work, work / "target", answering, seed=seed, device=device, log=log)
    shape = shape or DrafterShape()
    config = drafter_config_dict(shape, target.config, tokenizer.convert_tokens_to_ids(MASK_TOKEN))
    drafter = new_drafter(config, target, seed)
    settings = settings or DrafterSettings(steps=steps)
    settings.steps = steps
    log(
        f"drafter: {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M parameters, block {shape.block_size}, "
        f"taps {list(shape.target_layer_ids)}, {steps} steps on {device}"
    )
    losses = train_drafter(drafter, target, answers.own, settings, seed=seed, device=device, log=log)
    acc = teacher_forced_acceptance(drafter, target, answers.held, seed=seed, device=device)
    log(f"drafter: teacher-forced acceptance length on held-out target answers: {acc:.2f}")
    save_drafter(drafter, config, work / "drafter")
    return losses


def train_dflash2_stage(
    work: Path,
    *,
    seed: int,
    steps: int,
    device: str,
    source: Path,
    target_dir: Path,
    answering: AnswerSettings,
    settings: DrafterSettings,
    log: Log = print,
) -> list[float]:
    """The DFlash2 drafter: `source`'s DFlash drafter with DFlash2's modules added (train/dflash2.py),
    trained against the target in `target_dir` on its fresh greedy answers; written to work/drafter2."""
    from dflash_chat.train.dflash2 import dflash2_config_dict, from_dflash

    target, answers, dflash, config = shipped_drafter(
        work, source, target_dir, answering, seed=seed, device=device, log=log
    )
    config2 = dflash2_config_dict(config)
    drafter = from_dflash(dflash, config2, target, seed)
    settings.steps = steps
    log(
        f"dflash2: {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M parameters from {source}, "
        f"{steps} steps on {device}"
    )
    before = teacher_forced_acceptance(dflash.to(device), target, answers.held, seed=seed, device=device)
    losses = train_drafter(drafter, target, answers.own, settings, seed=seed, device=device, log=log)
    after = teacher_forced_acceptance(drafter, target, answers.held, seed=seed, device=device)
    log(
        f"dflash2: teacher-forced acceptance length on held-out target answers: {after:.2f} "
        f"(the DFlash drafter it started from: {before:.2f})"
    )
    save_drafter(drafter, config2, work / "drafter2")
    return losses
