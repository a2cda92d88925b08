"""`dflash-chat models`: the catalog, what fits this machine and what is already cached."""

from __future__ import annotations

import argparse

from dflash_chat import hardware
from dflash_chat.catalog import Catalog, CatalogError, Pair, Source, is_quant_name, load_catalog
from dflash_chat.hardware import Choice, Machine, NoFitError, gb


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list the model pairs, what fits this machine and what is cached",
        description="List the model pairs dflash-chat knows (shipped and from config.toml), "
        "whether each quant fits this machine's free memory, and what is already downloaded.",
    )
    hardware.add_choice_arguments(parser, files=False)  # --model, --quant, --drafter-quant: rows for those only
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dflash_chat import hub  # huggingface_hub loads only when the command runs

    catalog = load_catalog()
    pairs = _pairs(catalog, args)
    machine = hardware.probe()
    try:
        pick: Choice | None = hardware.choose(machine, catalog, model=args.model, quant=args.quant,
                                              drafter_quant=args.drafter_quant, context=args.context)
        verdict = f"Pick: {pick.explanation}"
    except NoFitError as exc:
        pick, verdict = None, f"Pick: none. {exc}"

    free = f"{gb(machine.available)} free"
    print(f"This machine: {machine.label}, {free}" + (f" ({machine.cuda_note})" if machine.cuda_note else ""))
    rows = [("MODEL", "QUANT", "SIZE", "DRAFTER", "NEEDS", "FITS", "CACHED", "")]
    for pair in pairs:
        rows += _rows(catalog, pair, machine, args, pick)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(verdict)
    print(f"Cache: {hub.default_cache_dir()}  (dflash-chat pull MODEL --quant Q downloads ahead of time)")
    return 0


def _pairs(catalog: Catalog, args: argparse.Namespace) -> list[Pair]:
    """The pairs to list: the one named, else those offering the quants asked for (CatalogError if none does)."""
    pairs = [catalog.get(args.model)] if args.model else list(catalog.ranked())
    offering, refusal = [], None
    for pair in pairs:
        try:
            if args.quant:
                pair.target(args.quant)
            if args.drafter_quant:
                pair.drafter(args.drafter_quant)
        except CatalogError as exc:
            refusal = refusal or exc
            continue
        offering.append(pair)
    if offering:
        return offering
    if args.model or len(pairs) == 1 or (args.quant and not is_quant_name(args.quant)):
        raise refusal
    drafters = ", ".join(dict.fromkeys(q for p in pairs for q in p.drafter_quants))
    raise CatalogError(f"no model has drafter quant {args.drafter_quant} (they have {drafters})")


def _rows(
    catalog: Catalog, pair: Pair, machine: Machine, args: argparse.Namespace, pick: Choice | None
) -> list[tuple[str, ...]]:
    from dflash_chat import hub

    ctx = min(args.context or pair.default_context, pair.max_context)  # a row per pair even past its maximum
    tokenizer_cached = hub.cached_parts(pair.tokenizer) is not None
    rows = []
    for target in [pair.target(args.quant)] if args.quant else pair.targets:
        # the preferred drafter that fits beside this target, else the smallest option
        best = hardware.choose(machine, catalog, model=pair.name, quant=target.quant, drafter_quant=args.drafter_quant,
                               context=ctx, allow_no_fit=True)
        drafter, need = best.drafter, best.budget
        picked = pick is not None and (pick.pair, pick.target, pick.drafter) == (pair, target, drafter)
        rows.append(
            (
                pair.name,
                target.quant,
                gb(target.size),
                drafter.quant if drafter else "-",
                f"{gb(need.need)} @{hardware.context_label(ctx)}",
                "yes" if need.fits else "no",
                _cached(target, drafter, tokenizer_cached),
                "<- pick" if picked else "",
            )
        )
    return rows


def _cached(target: Source, drafter: Source | None, tokenizer_cached: bool) -> str:
    from dflash_chat import hub

    have = {
        "target": hub.cached_parts(target) is not None,
        "drafter": drafter is None or hub.cached_parts(drafter) is not None,
        "tokenizer": tokenizer_cached,
    }
    if all(have.values()):
        return "yes"
    present = [name for name, ok in have.items() if ok and not (name == "drafter" and drafter is None)]
    return "+".join(present) if present else "-"
