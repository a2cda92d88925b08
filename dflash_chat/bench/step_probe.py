"""One tree's decode steps on the demo pair, timed: what `bench --demo --against REV` runs in each tree.

Run as a script in a fresh process, with the tree to measure first on PYTHONPATH:
`python step_probe.py --threads 1 --prompts 2 --tokens 128` prints one JSON object; with `--serve` it answers one
prompt with one kind per request line (what the guard drives, answer by answer in turn with the other tree's). It imports nothing of this
tree but what it finds in the one it measures, and knows the older layouts of the package (the demo pair in
`dflash_chat.demo`, the prompt in `dflash_chat.chat.prompt`, an `Engine` without draft and speculate settings,
as at c292777), so the same measure runs in both trees of a comparison (bench/step_guard.py).

Kinds, each its own engine over the one loaded target, every prompt decoded by each in turn (greedy, the
held-out code questions, thinking off): `plain` (no drafts), `dflash` (the DFlash drafter, 15 drafts: a 16-token
verify), and where the tree has them `mtp` (the target's MTP layer, MTP_DEPTH deep), `lookup` (prompt lookup, up
to 15 drafts) and `auto` (the app's defaults). Each kind's figures are sums over its answers: steps, new tokens,
decode, draft and verify seconds, and the decode loop's host seconds (`host_s`; None in a tree that does not
count them), per method where the tree counts methods.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys

DRAFTS = 15  # the DFlash drafter's and lookup's fixed drafts
MTP_DEPTH = 3  # the MTP layer's fixed depth (the deepest `auto` chooses)
KINDS = ("plain", "dflash", "mtp", "lookup", "auto")


def _first(*names: str):
    """The first attribute that imports, of "module:attribute" names (newer layouts first); None if none does."""
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            continue
    return None


def _engine(engine_class, target, drafter=None, *, needs: tuple[str, ...] = (), **settings):
    """An Engine with the settings this tree's Engine takes; None when it lacks one that `needs` names (a tree
    before the speculate setting has no MTP layer or prompt lookup to choose; its drafter drafts whole blocks)."""
    accepted = inspect.signature(engine_class.__init__).parameters
    if any(name not in accepted for name in needs):
        return None
    given = {name: value for name, value in settings.items() if name in accepted and value is not None}
    return engine_class(target, drafter, **given)


def engines(kinds: tuple[str, ...], device: str = "cpu") -> tuple[dict, object, list]:
    """(kind -> engine of this tree, the tokenizer, the stop ids) over one loaded demo target."""
    import torch

    demo_paths = _first("dflash_chat.models.demo:demo_paths", "dflash_chat.demo:demo_paths")
    load_pair = _first("dflash_chat.engine.load:load_pair")
    load_drafter = _first("dflash_chat.engine.load:load_drafter")
    load_mtp = _first("dflash_chat.engine.load:load_mtp")
    engine_class = _first("dflash_chat.engine.spec:Engine")
    if demo_paths is None or load_pair is None or load_drafter is None or engine_class is None:
        raise SystemExit("this tree has no demo pair or engine the step probe knows (c292777 or later)")
    target_dir, drafter_dir = (
        demo_paths("dflash") if "kind" in inspect.signature(demo_paths).parameters else demo_paths()
    )
    plain = load_pair(target_dir, None, device=device, dtype=torch.float32)
    target = plain.engine.target
    ends = tuple(getattr(plain.engine, "end_ids", ()))
    common = {"max_context": plain.engine.max_context, "end_ids": ends or None}

    def mtp():
        return load_mtp(target_dir, target) if load_mtp is not None else None

    def drafter():
        return load_drafter(drafter_dir, target)

    made = {
        "plain": lambda: _engine(engine_class, target, None, draft="off", speculate="none", **common),
        "dflash": lambda: _engine(engine_class, target, drafter(), draft=DRAFTS, speculate="dflash", **common),
        "mtp": lambda: (
            (layer := mtp()) is not None
            and _engine(
                engine_class, target, None, needs=("speculate",), mtp=layer, draft=MTP_DEPTH, speculate="mtp", **common
            )
        ),
        "lookup": lambda: _engine(
            engine_class, target, None, needs=("speculate",), draft=DRAFTS, speculate="lookup", **common
        ),
        "auto": lambda: _engine(
            engine_class, target, drafter(), needs=("speculate",), mtp=mtp(), draft="auto", speculate="auto", **common
        ),
    }
    out = {kind: made[kind]() for kind in kinds}
    stop_token_ids = _first("dflash_chat.runtime.prompt:stop_token_ids", "dflash_chat.chat.prompt:stop_token_ids")
    stops = sorted(set(ends) | set(stop_token_ids(plain.tokenizer) if stop_token_ids is not None else ()))
    return {kind: engine for kind, engine in out.items() if engine}, plain.tokenizer, stops


def prompts(tokenizer, count: int) -> list[list[int]]:
    """The first `count` held-out code questions, as the app encodes them (thinking off)."""
    heldout = _first("dflash_chat.models.demo:demo_heldout_prompts", "dflash_chat.train.evaluate:demo_heldout_prompts")
    build_prompt = _first("dflash_chat.runtime.prompt:build_prompt", "dflash_chat.chat.prompt:build_prompt")
    return [build_prompt(tokenizer, chat, thinking=False).ids for chat in heldout()[:count]]


def answer(engine, prompt: list[int], max_new_tokens: int, stops: list[int]):
    """Greedy, from an empty state: the answer's GenerationStats."""
    params_class = _first(
        "dflash_chat.engine.sampling_params:SamplingParams", "dflash_chat.engine.sampling:SamplingParams"
    )
    params = params_class(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=list(stops))
    engine.reset()
    stats = None
    for event in engine.generate(prompt, params):
        stats = getattr(event, "stats", stats)
    return stats


def _figures(stats_list) -> dict:
    total = {
        name: sum(getattr(s, name) for s in stats_list)
        for name in ("steps", "new_tokens", "decode_s", "draft_s", "verify_s")
    }
    host = [getattr(s, "host_s", None) for s in stats_list]
    total["host_s"] = None if None in host else sum(host)
    total["answers"] = len(stats_list)
    methods: dict[str, dict] = {}
    for s in stats_list:
        for name, m in getattr(s, "methods", {}).items():
            row = methods.setdefault(name, {"steps": 0, "drafted": 0, "accepted": 0, "host_s": 0.0})
            row["steps"] += m.steps
            row["drafted"] += m.drafted
            row["accepted"] += m.accepted
            row["host_s"] = None if row["host_s"] is None or not hasattr(m, "host_s") else row["host_s"] + m.host_s
    total["methods"] = methods
    return total


def _ready(*, threads: int, count: int, tokens: int, kinds: tuple[str, ...], device: str):
    """(kind -> engine, the prompts, the stop ids), each engine warmed up by one answer (first calls pay for
    allocations, and auto for measuring its step costs)."""
    import torch

    torch.set_num_threads(threads)
    made, tokenizer, stops = engines(kinds, device)
    ids = prompts(tokenizer, count)
    for engine in made.values():
        answer(engine, ids[0], tokens, stops)
    return made, ids, stops


def measure(*, threads: int, count: int, tokens: int, kinds: tuple[str, ...] = KINDS, device: str = "cpu") -> dict:
    """Every prompt answered by each kind in turn; each kind's figures summed over its answers."""
    made, ids, stops = _ready(threads=threads, count=count, tokens=tokens, kinds=kinds, device=device)
    runs: dict[str, list] = {kind: [] for kind in made}
    for prompt in ids:
        for kind, engine in made.items():
            runs[kind].append(answer(engine, prompt, tokens, stops))
    return {
        "threads": threads,
        "prompts": len(ids),
        "tokens": tokens,
        "kinds": {k: _figures(v) for k, v in runs.items()},
    }


def serve(*, threads: int, count: int, tokens: int, kinds: tuple[str, ...] = KINDS, device: str = "cpu") -> None:
    """Answer on request, so that another tree's probe can take turns with this one answer by answer: a first line
    {"kinds": [...], "prompts": n} once ready, then for each line "KIND INDEX" read, that answer's figures as one
    JSON line (a `measure` kind of one answer); "quit" or the end of the input ends it."""
    made, ids, stops = _ready(threads=threads, count=count, tokens=tokens, kinds=kinds, device=device)
    print(json.dumps({"kinds": list(made), "prompts": len(ids)}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            return
        kind, index = words[0], int(words[1])
        print(json.dumps(_figures([answer(made[kind], ids[index], tokens, stops)])), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one tree's decode steps on the demo pair, timed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--serve", action="store_true", help="answer on request, one answer a line (see serve())")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    given = dict(threads=args.threads, count=args.prompts, tokens=args.tokens, kinds=kinds, device=args.device)
    if args.serve:
        serve(**given)
    else:
        print(json.dumps(measure(**given)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
