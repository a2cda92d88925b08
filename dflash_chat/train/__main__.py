"""`python -m dflash_chat.train demo|eval`: rebuild the embedded demo pair, or measure it."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "demo_data"
STAGES = ("prepare", "target", "drafter", "dflash2", "finetune", "calibrate", "ship")
DEFAULT_STAGES = ("prepare", "target", "drafter", "ship")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dflash_chat.train")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train the demo target and its DFlash drafter, then ship them")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--minutes",
        type=float,
        default=40.0,
        help="time budget when step counts are not given: 55%% for the target, 35%% for the drafter "
        "stage (a fifth of that generates its data), the rest for preparing and shipping",
    )
    demo.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the pair is shipped")
    demo.add_argument(
        "--work", type=Path, default=None, help="folder for intermediate files (default: the app's cache folder)"
    )
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    demo.add_argument(
        "--stages",
        default=",".join(DEFAULT_STAGES),
        help=f"comma-separated subset of {','.join(STAGES)}; dflash2 adds DFlash2's modules to "
        "--from-drafter and trains it against the target beside it (ship then ships drafter2/); finetune "
        "trains the shipped --finetune drafter further on greedy and sampled answers; calibrate fits the DFlash2 "
        "drafter's selector scale to sampled answers",
    )
    demo.add_argument(
        "--finetune",
        choices=("dflash", "dflash2"),
        default="dflash2",
        help="which shipped drafter the finetune stage trains (it starts from the one in --out)",
    )
    demo.add_argument(
        "--sampled-share",
        type=float,
        default=None,
        help="finetune: the share of training prompts answered by sampling at the app's settings",
    )
    demo.add_argument(
        "--distill", type=float, default=None, help="finetune: the weight of the distillation term KL(p || q)"
    )
    demo.add_argument(
        "--accept-weight",
        type=float,
        default=None,
        help="finetune, DFlash2: the weight of the selector's expected accepted drafts at the app's sampling "
        "settings (default: none)",
    )
    demo.add_argument(
        "--hard-anchors",
        type=float,
        default=0.0,
        help="finetune: the share of training blocks drawn where the engine's steps start (after tokens the "
        "drafter gave less chance than the target), the rest uniformly (default: 0, all uniform)",
    )
    demo.add_argument(
        "--from-drafter",
        type=Path,
        default=None,
        help="the DFlash drafter the dflash2 stage starts from (default: the drafter in --out); "
        "its target is the one in --out",
    )
    demo.add_argument("--target-steps", type=int, default=None)
    demo.add_argument("--drafter-steps", type=int, default=None)
    demo.add_argument(
        "--generated",
        type=int,
        default=None,
        help="how many training prompts the target answers for the drafter (default: per device)",
    )
    demo.add_argument(
        "--max-target-minutes",
        type=float,
        default=None,
        help="stop target training early past this many minutes (a shared machine's safety cap)",
    )
    demo.add_argument(
        "--max-drafter-minutes", type=float, default=None, help="stop drafter training early past this many minutes"
    )
    demo.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ev = sub.add_parser("eval", help="acceptance and DFlash-vs-AR speed of a pair on held-out prompts")
    ev.add_argument("--target", type=Path, default=DEFAULT_OUT / "target")
    ev.add_argument("--drafter", type=Path, default=DEFAULT_OUT / "drafter")
    ev.add_argument("--prompts", type=int, default=16)
    ev.add_argument("--max-new-tokens", type=int, default=128)
    ev.add_argument("--threads", type=int, default=2)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.command == "eval":
        from dflash_chat.train.evaluate import format_report, measure_pair

        print(
            format_report(
                measure_pair(args.target, args.drafter, prompts=args.prompts, max_new_tokens=args.max_new_tokens)
            )
        )
        return 0
    return run_demo(args)


def run_demo(args) -> int:
    import torch

    from dflash_chat.train import recipe

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(stages) - set(STAGES)
    if unknown:
        print(f"unknown stage(s) {', '.join(sorted(unknown))}; choose from {', '.join(STAGES)}", file=sys.stderr)
        return 2
    if args.work is None:
        from dflash_chat.paths import cache_dir

        args.work = cache_dir() / "demo_work"
    budget = args.minutes * 60
    if "prepare" in stages:
        recipe.prepare(args.work, seed=args.seed, log=_log)
    chosen = recipe.preset(device)
    if args.generated is not None:
        chosen.generated = args.generated
    _log(f"device {device}, seed {args.seed}, work folder {args.work}")
    if "target" in stages:
        steps = args.target_steps or recipe.calibrate_target_steps(
            args.work, 0.55 * budget, device, args.seed, chosen.target
        )
        _log(f"target steps: {steps} (repeat with --target-steps {steps})")
        if args.max_target_minutes:
            chosen.target.max_seconds = 60 * args.max_target_minutes
        recipe.train_target_stage(
            args.work, seed=args.seed, steps=steps, device=device, settings=chosen.target, log=_log
        )
    if "drafter" in stages:
        steps = args.drafter_steps or recipe.calibrate_drafter_steps(
            args.work, 0.35 * budget, device, args.seed, chosen.drafter
        )
        _log(f"drafter steps: {steps} (repeat with --drafter-steps {steps})")
        if args.max_drafter_minutes:
            chosen.drafter.max_seconds = 60 * args.max_drafter_minutes
        recipe.train_drafter_stage(
            args.work,
            seed=args.seed,
            steps=steps,
            device=device,
            settings=chosen.drafter,
            generated=chosen.generated,
            gen_batch=chosen.gen_batch,
            max_new_tokens=chosen.max_new_tokens,
            log=_log,
        )
    if "dflash2" in stages:
        steps = args.drafter_steps or recipe.DFLASH2_STEPS
        _log(f"dflash2 steps: {steps} (repeat with --drafter-steps {steps})")
        settings = replace(chosen.drafter, lr=recipe.DFLASH2_LR)
        if args.max_drafter_minutes:
            settings.max_seconds = 60 * args.max_drafter_minutes
        recipe.train_dflash2_stage(
            args.work,
            seed=args.seed,
            steps=steps,
            device=device,
            source=args.from_drafter or args.out / "drafter",
            target_dir=args.out / "target",
            generated=args.generated or chosen.generated,
            settings=settings,
            gen_batch=chosen.gen_batch,
            max_new_tokens=chosen.max_new_tokens,
            log=_log,
        )
    if "finetune" in stages:
        steps = args.drafter_steps or recipe.FINETUNE_STEPS
        distill = recipe.FINETUNE_DISTILL if args.distill is None else args.distill
        _log(f"finetune steps: {steps} (repeat with --drafter-steps {steps})")
        settings = replace(chosen.drafter, lr=recipe.FINETUNE_LR, distill=distill, accept=args.accept_weight or 0.0)
        if args.max_drafter_minutes:
            settings.max_seconds = 60 * args.max_drafter_minutes
        share = recipe.FINETUNE_SAMPLED_SHARE if args.sampled_share is None else args.sampled_share
        recipe.finetune_stage(
            args.work,
            kind=args.finetune,
            source=args.out / ("drafter2" if args.finetune == "dflash2" else "drafter"),
            target_dir=args.out / "target",
            seed=args.seed,
            steps=steps,
            device=device,
            generated=args.generated or chosen.generated,
            settings=settings,
            sampled_share=share,
            gen_batch=chosen.gen_batch,
            max_new_tokens=chosen.max_new_tokens,
            hard_anchors=args.hard_anchors,
            log=_log,
        )
    if "calibrate" in stages:
        drafter2 = args.work / "drafter2"  # what a stage of this run made, else the shipped one
        recipe.calibrate_stage(
            args.work,
            source=drafter2 if drafter2.is_dir() else args.out / "drafter2",
            target_dir=args.out / "target",
            seed=args.seed,
            device=device,
            log=_log,
        )
    if "ship" in stages:
        recipe.ship(args.work, args.out, log=_log)
    return 0


_START = time.perf_counter()


def _log(message: str) -> None:
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
