"""`dflash-chat models`: the catalog, what fits this machine (or a card you plan for) and what is cached."""

from __future__ import annotations

import argparse
import os

from dflash_chat.errors import UserError
from dflash_chat.models import hardware
from dflash_chat.models.catalog import Catalog, CatalogError, Pair, Source, is_quant_name, load_catalog
from dflash_chat.models.hardware import Choice, Machine, NoFitError
from dflash_chat.models.sizes import size_text


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list the model pairs, what fits this machine and what is cached",
        description="List the model pairs dflash-chat knows (shipped and from config.toml), "
        "whether each quant fits this machine's free memory (or a GPU of --vram GiB), and what is "
        "already downloaded. The pick is what the chat app runs.",
    )
    hardware.add_choice_arguments(parser, files=False)  # --model, --quant, --drafter-quant: rows for those only
    parser.add_argument(
        "--vram",
        type=float,
        metavar="GiB",
        help="plan for a GPU of this size as sold (e.g. 24 for a 24 GiB card, which holds 25.8 GB) instead of "
        "this machine",
    )
    parser.set_defaults(handler=run)


def app_choice(
    machine: Machine, catalog: Catalog, context: int | None = None, vision: str | None = None
) -> tuple[str, Choice | None]:
    """What the chat app runs on `machine` with the saved settings (`vision`: --vision over the setting): (its
    one-line explanation, the catalog choice, or None when it runs the built-in demo pair or a path the `model`
    setting names). `models`, `doctor` and `pull` say this, so they never disagree with the app."""
    from dflash_chat import settings as settings_module
    from dflash_chat.runtime import model_manager
    from dflash_chat.runtime.model_source import ModelSource, Pick, resolve

    settings = settings_module.load()
    request = resolve(settings, pick=Pick(context=context))
    if isinstance(request, ModelSource):
        drafter = f" with {request.drafter}" if request.drafter else ""
        return f"the `model` setting runs {request.target}{drafter} as it is", None
    chosen = model_manager.choose(
        request, settings.context_length, machine=machine, catalog=catalog, vision=vision or settings.vision
    )
    return chosen.explanation, chosen.choice


def vision_for(args: argparse.Namespace) -> str:
    """--vision, else the vision setting."""
    from dflash_chat import settings as settings_module

    return getattr(args, "vision", None) or settings_module.load().vision


def context_for(args: argparse.Namespace) -> int:
    """--context, else the context the chat app sizes its model for."""
    from dflash_chat import settings as settings_module

    return args.context or settings_module.load().context_length


def run(args: argparse.Namespace) -> int:
    from dflash_chat.models import hub  # huggingface_hub loads only when the command runs

    catalog = load_catalog()
    if args.vram is not None:
        if args.vram <= 0:
            raise UserError(f"--vram takes the GPU's size in GiB, e.g. --vram 24 (got {args.vram:g})")
        machine = hardware.planned(args.vram)
        print(f"Planning for a {args.vram:g} GiB GPU (--vram: {size_text(machine.total)}), all of it free")
    else:
        machine = hardware.probe()
        free = f"{size_text(machine.available)} free"
        print(f"This machine: {machine.label}, {free}" + (f" ({machine.cuda_note})" if machine.cuda_note else ""))
    context = context_for(args)
    pairs = _pairs(catalog, args)
    pick: Choice | None
    try:
        if args.model or args.quant or args.drafter_quant:
            pick = hardware.choose(
                machine,
                catalog,
                model=args.model,
                quant=args.quant,
                drafter_quant=args.drafter_quant,
                context=context,
                vision=vision_for(args),
            )
            explanation = pick.explanation
        else:
            explanation, pick = app_choice(machine, catalog, context, vision=args.vision)
        verdict = f"Pick: {explanation}"
    except NoFitError as exc:
        pick, verdict = None, f"Pick: none. {exc}"

    rows: list[tuple[str, ...]] = [("MODEL", "QUANT", "SIZE", "DRAFTER", "NEEDS", "FITS", "CACHED", "")]
    for pair in pairs:
        rows += _rows(catalog, pair, machine, context, pick, args)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print(verdict)
    if pick is not None:
        print(f"Drafting: {pick.drafting}")
        print(pick.vision.line)
    print_endpoints()
    print(f"Cache: {hub.default_cache_dir()}  (dflash-chat pull MODEL --quant Q downloads ahead of time)")
    return 0


def print_endpoints() -> None:
    """The named servers of the endpoints setting, or how to name one."""
    from dflash_chat import settings as settings_module
    from dflash_chat.runtime.endpoint import key_env

    endpoints = settings_module.read()[0].endpoints
    if not endpoints:
        print(
            "Endpoints: none saved (dflash-chat --set endpoints.NAME=URL names an OpenAI-compatible server; "
            "dflash-chat --endpoint NAME chats with it)"
        )
        return
    print("Endpoints (dflash-chat --endpoint NAME):")
    width = max(len(name) for name in endpoints)
    url_width = max(len(url) for url in endpoints.values())
    for name, url in sorted(endpoints.items()):
        key = key_env(name)
        print(
            f"  {name.ljust(width)}  {url.ljust(url_width)}  key: {key} {'(set)' if os.environ.get(key) else '(not set)'}"
        )


def _pairs(catalog: Catalog, args: argparse.Namespace) -> list[Pair]:
    """The pairs to list: the one named, else those offering the quants asked for (CatalogError if none does)."""
    pairs = [catalog.get(args.model)] if args.model else list(catalog.ranked())
    offering: list[Pair] = []
    refusal: CatalogError | None = None
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
        assert refusal is not None  # no pair offers what was asked: each said why
        raise refusal
    drafters = ", ".join(dict.fromkeys(q for p in pairs for q in p.drafter_quants))
    raise CatalogError(f"no model has drafter quant {args.drafter_quant} (they have {drafters})")


def _rows(
    catalog: Catalog, pair: Pair, machine: Machine, context: int, pick: Choice | None, args: argparse.Namespace
) -> list[tuple[str, ...]]:
    from dflash_chat.models import hub

    ctx = min(context, pair.max_context)  # a row per pair even past its maximum
    tokenizer_cached = hub.cached_parts(pair.tokenizer) is not None
    rows: list[tuple[str, ...]] = []
    for target in [pair.target(args.quant)] if args.quant else pair.targets:
        # the preferred drafter that fits beside this target, else the smallest option
        best = hardware.choose(
            machine,
            catalog,
            model=pair.name,
            quant=target.quant,
            drafter_quant=args.drafter_quant,
            context=ctx,
            allow_no_fit=True,
            vision=vision_for(args),
        )
        drafter, need = best.drafter, best.budget
        tower = best.vision.source if best.vision.loads else None
        mmproj = tower if tower is not None and tower.kind == "mmproj" and tower.path is None else None
        picked = pick is not None and (pick.pair, pick.target, pick.drafter) == (pair, target, drafter)
        rows.append(
            (
                pair.name,
                target.quant,
                size_text(target.size),
                _drafter_cell(pair, drafter),
                f"{size_text(need.need)} @{hardware.context_label(ctx)}",
                "yes" if need.fits else "no",
                _cached(target, drafter, tokenizer_cached, mmproj),
                "<- pick" if picked else "",
            )
        )
    return rows


def _drafter_cell(pair: Pair, drafter: Source | None) -> str:
    """'Q8_0', 'Q8_0 (2026-04)' when the drafter exists in several trainings, 'Q8_0 (DFlash2)' for a
    DFlash2 drafter, 'MTP' for a target that runs alone with its own MTP layer."""
    if drafter is None:
        return "MTP" if pair.has_mtp else "-"  # the target alone drafts with its own MTP layer
    if len(pair.drafter_versions) > 1 and drafter.version:
        return f"{drafter.quant} ({drafter.version})"
    if hardware.is_dflash2(drafter):
        return f"{drafter.quant} (DFlash2)"
    return drafter.quant


def _cached(target: Source, drafter: Source | None, tokenizer_cached: bool, mmproj: Source | None = None) -> str:
    """'yes', or the parts that are ('drafter+tokenizer'), or '-'; the vision tower's mmproj counts where the row's
    choice loads it."""
    from dflash_chat.models import hub

    have = {
        "target": hub.cached_parts(target) is not None,
        "drafter": drafter is None or hub.cached_parts(drafter) is not None,
        "tokenizer": tokenizer_cached,
        "vision": mmproj is None or hub.cached_parts(mmproj) is not None,
    }
    if all(have.values()):
        return "yes"
    absent = {"drafter": drafter is None, "vision": mmproj is None}
    present = [name for name, ok in have.items() if ok and not absent.get(name, False)]
    return "+".join(present) if present else "-"
