"""`python -m dflash_chat.train demo|eval`: rebuild the embedded demo pair, or measure it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "demo_data"
STAGES = (
    "prepare",
    "target",
    "tools",
    "retrain",
    "drafter",
    "dflash2",
    "finetune",
    "calibrate",
    "mtp",
    "ship",
    "vision",
)
DEFAULT_STAGES = ("prepare", "target", "drafter", "ship")
# the run that trained the shipped demo target's MTP layer (docs/ARCHITECTURE.md, The MTP layer)
MTP_COMMAND = (
    "python -m dflash_chat.train demo --device cpu --stages prepare,mtp,ship --generated 384 --max-drafter-minutes 10"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dflash_chat.train")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="train the demo target and its DFlash drafter, then ship them",
        epilog=f"The shipped target's own MTP layer was trained by: {MTP_COMMAND} (1500 steps; 16 min on a 2-core "
        "CPU, most of it preparing the corpus and answering). Re-run it after retraining the target: with "
        "`target` among the stages the layer is trained for the target this run made, otherwise for --out's.",
    )
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
        help=f"comma-separated subset of {','.join(STAGES)}; tools trains the target in --out further to call "
        "tools (synthetic tool chats beside its corpus; --target-steps) and writes the held-out tool chats; retrain "
        "trains it on tool chats, copy tasks and its corpus, resumably (checkpoint and curve in work/retrain/; run "
        "it again to go on; --target-steps, --max-target-minutes bounds one chunk); dflash2 adds DFlash2's modules to "
        "--from-drafter and trains it against the target beside it (ship then ships drafter2/); finetune "
        "trains the shipped --finetune drafter further on greedy and sampled answers; calibrate fits the DFlash2 "
        "drafter's selector scale to sampled answers; mtp trains the target's own MTP layer (the target frozen: "
        "work/target when `target` is among the stages, else --out's) and writes the target with the layer inside "
        "its safetensors to work/target for ship (the drafter stages' --drafter-steps, --max-drafter-minutes and "
        "--generated apply); vision gives --out's target the vision tokens and writes the demo's random vision "
        "tower to --out/vision (train/vision.py; ship ends with it too)",
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
        "--tool-share",
        type=float,
        default=None,
        help="finetune: the share of training prompts that are tool chats (a request, or a tool's result to "
        "answer) (default 0.25)",
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
    demo.add_argument(
        "--carry",
        type=Path,
        default=None,
        help="retrain: the run carried between machines (its weights in float16, step, curve and random states, "
        "without the optimizer's moments): started from when work/retrain/ has no checkpoint, written at the end "
        "of each chunk (commit it)",
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
    recipe.run_stages(args, stages, device, _log)
    return 0


_START = time.perf_counter()


def _log(message: str) -> None:
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
