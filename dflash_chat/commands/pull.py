"""`dflash-chat pull [MODEL] [--quant Q] [--drafter-quant Q]`: download a model pair ahead of time."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dflash_chat import hardware
from dflash_chat.catalog import Catalog, Pair, Source, load_catalog
from dflash_chat.settings import flag

if TYPE_CHECKING:
    from dflash_chat import hub


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "pull",
        help="download a model pair (target, drafter, tokenizer) ahead of time",
        description="Download a model pair into the Hugging Face cache. Without MODEL, the pair "
        "and quants that fit this machine; an interrupted pull resumes where it stopped.",
    )
    parser.add_argument("model", nargs="?", help="model pair name from `dflash-chat models`")
    parser.add_argument("--quant", help="target quant, e.g. Q8_0 or Q4_K_M (default: the best that fits)")
    parser.add_argument("--drafter-quant", help="drafter quant, e.g. Q8_0, Q4_K_M or BF16")
    parser.add_argument("--context", type=flag("context_length"), help="context length the choice is sized for (256-1048576)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dflash_chat import hub  # huggingface_hub loads only when the command runs

    catalog = load_catalog()
    pair, target, drafter = _what_to_pull(catalog, args)
    plan = hub.plan(target, drafter, pair.tokenizer)
    todo = plan.missing_bytes()
    print(
        f"{pair.title}: {len(plan.files)} files, {hub.size_text(plan.total_bytes)}"
        + (f", {hub.size_text(todo)} to download" if todo else ", all cached")
        + f" -> {plan.cache_dir}"
    )
    files = _download_with_bar(plan)
    print(f"target:    {files.target}")
    if files.drafter:
        print(f"drafter:   {files.drafter}")
    print(f"tokenizer: {files.tokenizer}")
    return 0


def _what_to_pull(catalog: Catalog, args: argparse.Namespace) -> tuple[Pair, Source, Source | None]:
    """Pinned quants need no probe; otherwise the picker chooses (the smallest when nothing fits)."""
    if args.model and args.quant:
        pair = catalog.get(args.model)
        target = pair.target(args.quant)
        if args.drafter_quant:
            return pair, target, pair.drafter(args.drafter_quant)
        return pair, target, pair.drafters[0] if pair.drafters else None
    choice = hardware.choose(
        hardware.probe(),
        catalog,
        model=args.model,
        quant=args.quant,
        drafter_quant=args.drafter_quant,
        context=args.context,
        allow_no_fit=args.model is not None,  # a named model is fetched even if this machine is too small
    )
    print(choice.explanation)
    if not choice.fits:
        drafter = f" + drafter {choice.drafter.quant}" if choice.drafter else ""
        print(f"Fetching the smallest anyway: {choice.pair.title} {choice.target.quant}{drafter} (choose with --quant)")
    return choice.pair, choice.target, choice.drafter


def _download_with_bar(plan: hub.Plan) -> hub.ModelFiles:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from dflash_chat import hub

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns) as bar:
        tasks = {f.key: bar.add_task(f.filename, total=f.size) for f in plan.files}

        def show(event: hub.Progress) -> None:
            bar.update(tasks[event.file.key], completed=event.done)

        try:
            return hub.download(plan, progress=show)
        except KeyboardInterrupt:  # Ctrl-C: the partial file stays for the next run
            raise hub.DownloadCancelled() from None
