"""The demo run: the stages `python -m dflash_chat.train demo` names, in their fixed order, each with its
step count (from the flags, the stage's default or the time budget) and its device's settings (budget.py)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TypedDict

from dflash_chat.train.budget import Preset, calibrate_drafter_steps, calibrate_target_steps, preset
from dflash_chat.train.common import Log
from dflash_chat.train.mtp import MTP_STEPS, MTPSettings
from dflash_chat.train.stages.drafters import DFLASH2_LR, DFLASH2_STEPS, train_dflash2_stage, train_drafter_stage
from dflash_chat.train.stages.finetune import (
    FINETUNE_DISTILL,
    FINETUNE_LR,
    FINETUNE_STEPS,
    calibrate_stage,
    finetune_stage,
)
from dflash_chat.train.stages.mtp import mtp_stage
from dflash_chat.train.stages.prepare import prepare, train_target_stage
from dflash_chat.train.stages.retrain import RETRAIN_STEPS, RetrainSettings, retrain_stage
from dflash_chat.train.stages.ship import ship
from dflash_chat.train.stages.tools import TOOLS_STEPS, tools_settings, tools_stage
from dflash_chat.train.vision import vision_stage

TARGET_SHARE = 0.55  # of the time budget, for the target stage
DRAFTER_SHARE = 0.35  # for the drafter stage, its data included
FINETUNE_SAMPLED_SHARE = 0.5  # of the finetune's training prompts answered by sampling at the app's settings
FINETUNE_TOOL_SHARE = 0.25  # of the finetune's training prompts tool chats (the demo target calls tools)


def run_stages(args: argparse.Namespace, stages: list[str], device: str, log: Log) -> None:
    """The named `stages`, with the demo command's flags `args`, in the order the demo pair is built."""
    if "prepare" in stages:
        prepare(args.work, seed=args.seed, log=log)
    chosen = preset(device)
    if args.generated is not None:
        chosen.answering = replace(chosen.answering, generated=args.generated)
    if args.max_target_minutes:
        chosen.target.max_seconds = 60 * args.max_target_minutes
    if args.max_drafter_minutes:
        chosen.drafter.max_seconds = 60 * args.max_drafter_minutes  # the later drafter stages start from a copy
    log(f"device {device}, seed {args.seed}, work folder {args.work}")
    for name, stage in (
        ("target", _target),
        ("tools", _tools),
        ("retrain", _retrain),
        ("drafter", _drafter),
        ("dflash2", _dflash2),
        ("finetune", _finetune),
        ("calibrate", _calibrate),
        ("mtp", _mtp),
    ):
        if name in stages:
            stage(args, chosen, device, log)
    if "ship" in stages:
        ship(args.work, args.out, log=log)
    if "vision" in stages:
        vision_stage(args.out, log=log)  # the shipped tower is seed 0's, whatever the run's seed


class _Training(TypedDict):
    """The arguments every training stage takes besides the work folder and its own."""

    seed: int
    steps: int
    device: str
    log: Log


def _training(stage: str, args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> _Training:
    """The run's seed, device and log with `stage`'s step count (logged)."""
    return _Training(seed=args.seed, steps=_step_count(stage, args, chosen, device, log), device=device, log=log)


def _target(args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> None:
    train_target_stage(args.work, **_training("target", args, chosen, device, log), settings=chosen.target)


def _tools(args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> None:
    tools_stage(
        args.work,
        **_training("tools", args, chosen, device, log),
        source=args.out / "target",
        settings=tools_settings(chosen.target),
    )


def _retrain(args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> None:
    """One chunk of the resumable retraining run (work/retrain/), bounded by --max-target-minutes."""
    retrain_stage(
        args.work,
        **_training("retrain", args, chosen, device, log),
        source=args.out / "target",
        settings=RetrainSettings(steps=0, max_seconds=chosen.target.max_seconds, carried=args.carry),
    )


def _drafter(args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> None:
    train_drafter_stage(
        args.work,
        **_training("drafter", args, chosen, device, log),
        settings=chosen.drafter,
        answering=chosen.answering,
    )


def _dflash2(args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> None:
    train_dflash2_stage(
        args.work,
        **_training("dflash2", args, chosen, device, log),
        source=args.from_drafter or args.out / "drafter",
        target_dir=args.out / "target",
        answering=chosen.answering,
        settings=replace(chosen.drafter, lr=DFLASH2_LR),
    )


def _finetune(args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> None:
    distill = FINETUNE_DISTILL if args.distill is None else args.distill
    sampled_share = FINETUNE_SAMPLED_SHARE if args.sampled_share is None else args.sampled_share
    tool_share = FINETUNE_TOOL_SHARE if args.tool_share is None else args.tool_share
    finetune_stage(
        args.work,
        **_training("finetune", args, chosen, device, log),
        kind=args.finetune,
        source=args.out / ("drafter2" if args.finetune == "dflash2" else "drafter"),
        target_dir=args.out / "target",
        answering=replace(chosen.answering, sampled_share=sampled_share, tool_share=tool_share),
        settings=replace(chosen.drafter, lr=FINETUNE_LR, distill=distill, accept=args.accept_weight or 0.0),
        hard_anchors=args.hard_anchors,
    )


def _calibrate(args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> None:
    drafter2 = args.work / "drafter2"  # what a stage of this run made, else the shipped one
    calibrate_stage(
        args.work,
        source=drafter2 if drafter2.is_dir() else args.out / "drafter2",
        target_dir=args.out / "target",
        seed=args.seed,
        device=device,
        log=log,
    )


def _mtp(args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> None:
    """The target's MTP layer: for the target this run trained (work/target), else the shipped one in --out.
    The target it ships (with the layer inside) goes to work/target, for the ship stage."""
    mtp_stage(
        args.work,
        **_training("mtp", args, chosen, device, log),
        target_dir=args.work / "target" if "target" in _named(args.stages) else args.out / "target",
        answering=replace(chosen.answering, sampled_share=FINETUNE_SAMPLED_SHARE),
        settings=MTPSettings(steps=0, max_seconds=chosen.drafter.max_seconds, log_every=chosen.drafter.log_every),
    )


def _named(stages: str) -> set[str]:
    return {s.strip() for s in stages.split(",")}


def _step_count(stage: str, args: argparse.Namespace, chosen: Preset, device: str, log: Log) -> int:
    """`stage`'s step count from its flag, else its default; logged with the flag that repeats it."""
    if stage in ("target", "tools", "retrain"):  # all train the target
        given, flag = args.target_steps, "--target-steps"
    else:  # the drafter stages share one flag
        given, flag = args.drafter_steps, "--drafter-steps"
    steps = given or _default_steps(stage, args, chosen, device)
    log(f"{stage} steps: {steps} (repeat with {flag} {steps})")
    return steps


def _default_steps(stage: str, args: argparse.Namespace, chosen: Preset, device: str) -> int:
    """The steps that fit the stage's share of the time budget, or a fixed count for a stage that starts
    from a trained drafter."""
    budget = args.minutes * 60
    if stage == "target":
        return calibrate_target_steps(args.work, TARGET_SHARE * budget, device, args.seed, chosen.target)
    if stage == "drafter":
        return calibrate_drafter_steps(args.work, DRAFTER_SHARE * budget, device, args.seed, chosen.drafter)
    return {
        "tools": TOOLS_STEPS,
        "retrain": RETRAIN_STEPS,
        "dflash2": DFLASH2_STEPS,
        "finetune": FINETUNE_STEPS,
        "mtp": MTP_STEPS,
    }[stage]
