"""The stages that adjust a shipped drafter: finetune (further training on greedy and sampled answers)
and calibrate (the DFlash2 selector's scale)."""

from __future__ import annotations

import time
from pathlib import Path

from dflash_chat.train.common import Log
from dflash_chat.train.drafter import (
    DrafterSettings,
    Sequence,
    Taught,
    save_drafter,
    teach_all,
    teacher_forced_acceptance,
    train_drafter,
)
from dflash_chat.train.stages.answers import AnswerSettings, shipped_drafter

FINETUNE_STEPS = 600
FINETUNE_LR = 5e-4
FINETUNE_DISTILL = 1.0  # the distillation term's weight beside the hard labels
CALIBRATE_ANSWERS = 64  # sampled answers to training prompts the calibrate stage fits the selector's scale on


def finetune_stage(
    work: Path,
    *,
    kind: str,
    source: Path,
    target_dir: Path,
    seed: int,
    steps: int,
    device: str,
    answering: AnswerSettings,
    settings: DrafterSettings,
    hard_anchors: float = 0.0,
    log: Log = print,
) -> list[float]:
    """A shipped drafter (`source`, DFlash or DFlash2) trained further against its target on fresh answers,
    a share of them (`answering.sampled_share`) sampled at the app's settings, with the distillation term
    (settings.distill): what makes sampled drafts (T > 0) land (train/drafter.py, 4.). `hard_anchors`: the
    share of blocks drawn where the engine's steps start (train/anchors.py), by the source drafter's first
    drafts. Written to work/drafter or work/drafter2."""
    target, answers, drafter, config = shipped_drafter(
        work, source, target_dir, answering, seed=seed, device=device, log=log
    )
    settings.steps = steps
    log(
        f"finetune: {kind} drafter from {source}, {steps} steps on {device}, distill {settings.distill}, "
        f"accept {settings.accept}"
    )

    def acceptance() -> str:
        greedy = teacher_forced_acceptance(drafter, target, answers.held, seed=seed, device=device)
        drawn = teacher_forced_acceptance(drafter, target, answers.held_sampled, seed=seed, device=device)
        return f"{greedy:.2f} on greedy answers, {drawn:.2f} on sampled ones"

    before = acceptance()
    taught = _taught_with_engine_anchors(drafter, target, answers.own, hard_anchors, device, log)
    losses = train_drafter(drafter, target, answers.own, settings, seed=seed, device=device, log=log, taught=taught)
    log(f"finetune: teacher-forced acceptance length on held-out target answers: {acceptance()} (before: {before})")
    save_drafter(drafter, config, work / ("drafter2" if kind == "dflash2" else "drafter"))
    return losses


def _taught_with_engine_anchors(
    drafter, target, sequences: list[Sequence], share: float, device: str, log: Log
) -> list[Taught] | None:
    """The target's teaching for `sequences`, with a `share` of their blocks set to be drawn where the
    engine's steps start (train/anchors.py); None without a share (`train_drafter` teaches then)."""
    if not share:
        return None
    from dflash_chat.train.anchors import lean_to_engine_anchors
    from dflash_chat.train.dflash2 import app_params

    started = time.perf_counter()
    taught = teach_all(target, sequences, drafter.target_layer_ids, device)
    lean_to_engine_anchors(drafter, target, sequences, taught, app_params(), share, device)
    log(f"finetune: {share:g} of the anchors where the engine's steps start ({time.perf_counter() - started:.0f}s)")
    return taught


def calibrate_stage(
    work: Path,
    *,
    source: Path,
    target_dir: Path,
    seed: int,
    device: str,
    generated: int = CALIBRATE_ANSWERS,
    log: Log = print,
) -> float:
    """The DFlash2 drafter in `source` with its selector's scale fitted to the target's answers to `generated`
    training prompts, all sampled at the app's settings (train/calibrate.py); written to work/drafter2."""
    from dflash_chat.train.calibrate import apply_scale, best_scale, expected_accepts
    from dflash_chat.train.dflash2 import app_params

    answering = AnswerSettings(generated, sampled_share=1.0)
    target, answers, drafter, config = shipped_drafter(
        work, source, target_dir, answering, seed=seed, device=device, log=log
    )
    if getattr(drafter.cfg, "dflash2", None) is None:
        raise ValueError(f"{source} is not a DFlash2 drafter: only DFlash2's selector has a scale to fit")
    drafter.to(device).eval()
    sampling = app_params()
    accepts = expected_accepts(drafter, target, answers.own, sampling, seed=seed, device=device)
    scale = best_scale(accepts)
    shown = ", ".join(f"{s:g}: {v:.3f}" for s, v in accepts.items())
    log(f"calibrate: expected accepted drafts per block by selector scale ({shown}); scale {scale:g}")
    held = expected_accepts(
        drafter, target, answers.held_sampled, sampling, scales=(1.0, scale), seed=seed, device=device
    )
    log(f"calibrate: on held-out sampled answers {held[scale]:.3f} at scale {scale:g}, {held[1.0]:.3f} unscaled")
    apply_scale(drafter, config, scale)
    save_drafter(drafter, config, work / "drafter2")
    return scale
