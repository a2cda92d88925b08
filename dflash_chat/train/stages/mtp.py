"""The MTP stage: the demo target's own MTP layer, trained with the target frozen and shipped inside it."""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_chat.train.common import Log
from dflash_chat.train.mtp import MTPSettings, new_head, ship_head, teacher_forced_agreement, train_mtp
from dflash_chat.train.stages.answers import AnswerSettings, target_and_answers


def mtp_stage(
    work: Path,
    *,
    target_dir: Path,
    seed: int,
    steps: int,
    device: str,
    answering: AnswerSettings,
    settings: MTPSettings,
    log: Log = print,
) -> float:
    """An MTP layer for the target in `target_dir`, trained on its answers (train/mtp.py); the target with it
    written to work/target (the ship stage ships it). Returns its held-out teacher-forced agreement."""
    from dflash_chat.engine.load import load_target

    _, _, answers = target_and_answers(work, target_dir, answering, seed=seed, device=device, log=log)
    target = load_target(target_dir, device, torch.float32)  # the engine's module: the hidden states it hands over
    head = new_head(target, target_dir, seed)
    settings.steps = steps
    before = teacher_forced_agreement(head, target, answers.held)
    log(f"mtp: {sum(p.numel() for p in head.parameters()) / 1e6:.2f}M parameters, {steps} steps on {device}")
    train_mtp(head, target, answers.own, settings, seed=seed, log=log)
    after = teacher_forced_agreement(head, target, answers.held)
    log(f"mtp: teacher-forced top-1 agreement on held-out target answers {after:.3f} (before training: {before:.3f})")
    ship_head(head, target_dir, work / "target")
    return after
