"""`dflash-chat pull [MODEL] [--quant Q] [--drafter-quant Q] [--vision auto|off]`: download a model pair ahead of time,
with its vision tower's mmproj GGUF unless vision is off (or, when the picker chooses, where the pick loads it)."""

from __future__ import annotations

import argparse

from dflash_chat.models import hardware
from dflash_chat.models.catalog import Catalog, Pair, Source, load_catalog
from dflash_chat.models.hardware import Choice
from dflash_chat.models.sizes import size_text
from dflash_chat.settings import flag


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "pull",
        help="download a model pair (target, drafter, tokenizer) ahead of time",
        description="Download a model pair into the Hugging Face cache. Without MODEL, what the chat "
        "app would run on this machine; an interrupted pull resumes where it stopped.",
    )
    parser.add_argument("model", nargs="?", help="model pair name from `dflash-chat models`")
    parser.add_argument("--quant", help="target quant, e.g. Q8_0 or Q4_K_M (default: the best that fits)")
    parser.add_argument("--drafter-quant", help="drafter quant, e.g. Q8_0, Q4_K_M or BF16")
    parser.add_argument(
        "--context", type=flag("context_length"), help="context length the choice is sized for (256-1048576)"
    )
    parser.add_argument(
        "--vision",
        type=flag("vision"),
        metavar="auto|off",
        help="fetch the vision tower too (auto: with a pinned --quant always, else where the pick loads it) or "
        "not (off) (default: the vision setting)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dflash_chat.models import hub  # huggingface_hub loads only when the command runs
    from dflash_chat.runtime.progress import download_with_bars

    catalog = load_catalog()
    what = _what_to_pull(catalog, args)
    if what is None:
        return 0
    pair, target, drafter, mmproj = what
    plan = hub.plan(target, drafter, pair.tokenizer, mmproj=mmproj)
    hub.check_access(plan)  # a gated repo says what to do before anything downloads
    todo = plan.missing_bytes()
    print(
        f"{pair.title}: {len(plan.files)} files, {size_text(plan.total_bytes)}"
        + (f", {size_text(todo)} to download" if todo else ", all cached")
        + f" -> {plan.cache_dir}"
    )
    files = download_with_bars(plan)
    print(f"target:    {files.target}")
    if files.drafter:
        print(f"drafter:   {files.drafter}")
    print(f"tokenizer: {files.tokenizer}")
    if files.mmproj:
        print(f"vision:    {files.mmproj}")
    return 0


def _vision(args: argparse.Namespace) -> str:
    from dflash_chat import settings as settings_module

    return getattr(args, "vision", None) or settings_module.load().vision


def _mmproj(pair: Pair, target: Source, vision: str) -> Source | None:
    """The tower's GGUF to fetch beside `target` (none under `off`, nor for a safetensors target: its own files
    hold it)."""
    source = pair.vision_source(target) if vision != "off" else None
    return source if source is not None and source.kind == "mmproj" and source.path is None else None


def _chosen_mmproj(choice: Choice) -> Source | None:
    source = choice.vision.source if choice.vision.loads else None
    return source if source is not None and source.kind == "mmproj" and source.path is None else None


def _what_to_pull(
    catalog: Catalog, args: argparse.Namespace
) -> tuple[Pair, Source, Source | None, Source | None] | None:
    """(pair, target, drafter, the vision tower's mmproj). Pinned quants need no probe (the tower comes unless
    vision is off); nothing named pulls what the chat app would run (None when that is the built-in demo pair or a
    path: nothing to download); otherwise the picker chooses (the smallest when nothing fits), the tower where the
    pick loads it."""
    from dflash_chat.commands.models import app_choice, context_for

    if args.model and args.quant:
        pair = catalog.get(args.model)
        target = pair.target(args.quant)
        mmproj = _mmproj(pair, target, _vision(args))
        if args.drafter_quant:
            return pair, target, pair.drafter(args.drafter_quant), mmproj
        return pair, target, pair.drafters[0] if pair.drafters else None, mmproj
    machine = hardware.probe()
    if not (args.model or args.quant or args.drafter_quant):
        explanation, choice = app_choice(machine, catalog, args.context, vision=getattr(args, "vision", None))
        print(explanation)
        if choice is None:
            suggestion = next((p.name for p in catalog.ranked() if p.cpu_default), catalog.ranked()[-1].name)
            print(f"Nothing to download. To fetch a real model anyway: dflash-chat pull {suggestion}")
            return None
        return choice.pair, choice.target, choice.drafter, _chosen_mmproj(choice)
    choice = hardware.choose(
        machine,
        catalog,
        model=args.model,
        quant=args.quant,
        drafter_quant=args.drafter_quant,
        context=context_for(args),
        allow_no_fit=args.model is not None,  # a named model is fetched even if this machine is too small
        vision=_vision(args),
    )
    print(choice.explanation)
    if not choice.fits:
        drafter = f" + drafter {choice.drafter.quant}" if choice.drafter else ""
        print(f"Fetching the smallest anyway: {choice.pair.title} {choice.target.quant}{drafter} (choose with --quant)")
    return choice.pair, choice.target, choice.drafter, _chosen_mmproj(choice)
