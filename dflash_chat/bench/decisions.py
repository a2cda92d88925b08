"""`dflash-chat bench --demo --decisions`: auto's choices scored without timing noise.

`bench --demo` times whole answers, and on a small CPU model a class's figure moves by 5-10 % between runs (a
single prompt's by up to 25 %): too much to tell whether a change to how auto chooses helped. Here auto answers
the demo classes (the app's drafter, its MTP layer and prompt lookup; speculate and draft auto) with its step costs
frozen at one table, and every draft and verify it ran (a queued draft it did not use included) is priced from
that table. An answer's figure is plain decoding's price for the same tokens (one plain step a token after the
first) over auto's: what auto's choices alone are worth at those costs, the same every run for greedy answers.
`--decisions FILE` prices from a table an earlier run printed (its JSON, or its `costs` alone), so two trees,
or two versions of the chooser, are scored on the same prices; without FILE the run measures the table at warm-up, as the app does.
Records of earlier answers carry over from answer to answer, as in `bench --demo`; each answer is a new
conversation. The sampled leg answers each prompt with `seeds` seeds (--seeds): a change to the chooser changes
which texts are drawn, so two choosers' sampled figures differ by a few % at 16 answers a class (code 0.96x with
two seeds a prompt, 1.04x with six, the same chooser); greedy texts are plain decoding's whatever auto chooses.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_chat.bench.demo_pair import Sampling, engine_beside, prompt_classes
from dflash_chat.engine.draft_length import HELD, Costs, DraftMemory, Records
from dflash_chat.engine.events import Finished
from dflash_chat.engine.steps import Clock
from dflash_chat.errors import UserError

CLASSES = ("code", "raw_code", "prose", "copy")  # the image class drafts as the code questions do
SEEDS = 2  # sampled answers per prompt by default, seeds 10 i, 10 i + 1, ... for a class's i-th prompt


class FrozenCosts(Costs):
    """Step costs that the loop's timings do not move."""

    def observe_all(self, timings: list[tuple[str, int, float]]) -> None:
        return None


class PricedClock(Clock):
    """The loop's clock, noting each timed call's kind and size (what it is priced as)."""

    def __init__(self, device):
        super().__init__(device)
        self.calls: list[tuple[str, int]] = []

    def timed(self, kind: str, size: int, fn, *args) -> None:
        self.calls.append((kind, size))
        super().timed(kind, size, fn, *args)


def table(costs: Costs) -> dict:
    """A cost table as JSON takes it: seconds of a verify of each size, and of each method's draft for it."""
    return {"verify": dict(costs.verify), "draft": {m: dict(sizes) for m, sizes in costs.draft.items()}}


def read_table(path: Path, sizes: dict[str, list[int]], verify_sizes: list[int]) -> FrozenCosts:
    """The table in `path` (a run's JSON or its `costs`), with a figure for every size and method the engine
    weighs."""
    try:
        raw = json.loads(path.read_text())
        raw = raw.get("costs", raw)  # a whole run's JSON, or its table alone
        verify = {int(T): float(s) for T, s in raw["verify"].items()}
        draft = {m: {int(T): float(s) for T, s in d.items()} for m, d in raw["draft"].items()}
    except OSError as exc:
        raise UserError(f"cannot read the cost table {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UserError(
            f"{path} is not a cost table: give the `costs` object a `bench --demo --decisions --json` run printed"
        ) from None
    missing = [f"verify {T}" for T in verify_sizes if verify.get(T, 0) <= 0]  # a draft may be free, a verify not
    missing += [f"{m} {T}" for m, Ts in sizes.items() for T in Ts if draft.get(m, {}).get(T, -1) < 0]
    if missing:
        raise UserError(f"{path} lacks a figure for {', '.join(missing)}: price every size auto weighs")
    return FrozenCosts(verify, draft)


def run(
    *, prompts: int, max_new_tokens: int, legs: list[Sampling], costs_file: Path | None, device: str, seeds: int = SEEDS
) -> dict:
    import torch

    from dflash_chat.engine.load import load_drafter, load_pair
    from dflash_chat.models.demo import chosen_kind, demo_drafters, demo_paths

    target_dir, _ = demo_paths()
    plain = load_pair(target_dir, None, device=device, dtype=torch.float32, draft="off", speculate="none", vision=False)
    kind = chosen_kind()
    engine = engine_beside(plain.engine, target_dir, load_drafter(demo_drafters()[kind], plain.engine.target))
    if costs_file is not None:
        engine.costs = read_table(costs_file, engine.method_sizes, engine.sizes)
    else:
        engine.warm_up()
        assert engine.costs is not None, "auto weighs plans: its warm-up measures the costs"
        engine.costs = FrozenCosts(**table(engine.costs))
    costs = engine.costs
    clock = engine.clock = PricedClock(engine.device)
    classes = prompt_classes(plain.tokenizer, prompts)
    records = Records()
    figures: dict = {}
    for leg in legs:
        per_class = {}
        for name in CLASSES:
            ratios: list[float] = []
            methods: dict[str, int] = {}
            for i, prompt in enumerate(classes[name]):
                for seed in range(1 if leg.greedy else seeds):
                    engine.reset()
                    clock.calls.clear()
                    memory = DraftMemory(records)
                    done = [
                        e for e in engine.generate(prompt, leg.params(max_new_tokens, 10 * i + seed), memory=memory)
                    ]
                    stats = next(e for e in done if isinstance(e, Finished)).stats
                    spent = sum(_price(costs, kind, T) for kind, T in clock.calls)
                    if stats.steps and spent > 0:
                        ratios.append((stats.new_tokens - 1) * costs.verify[1] / spent)
                    for method, m in stats.methods.items():
                        methods[method] = methods.get(method, 0) + m.steps
            per_class[name] = {
                "plain_over_auto": sum(ratios) / len(ratios) if ratios else None,
                "least": min(ratios, default=None),
                "answers": len(ratios),
                "steps": methods,
            }
        figures[leg.key] = {"title": leg.title, "classes": per_class}
    return {
        "setup": {
            "drafter": kind,
            "prompts_per_class": prompts,
            "max_new_tokens": max_new_tokens,
            "seeds": seeds,
            "costs_from": str(costs_file) if costs_file else "measured at warm-up",
        },
        "costs": table(costs),
        "temperatures": figures,
    }


def _price(costs: Costs, kind: str, T: int) -> float:
    if kind == "verify":
        return costs.verify[T]
    return costs.draft[kind.removesuffix(HELD)][T]


def format_report(f: dict) -> str:
    s = f["setup"]
    lines = [
        f"auto's choices on the demo pair ({s['drafter']}), step costs frozen ({s['costs_from']}): plain decoding's "
        f"price over auto's, {s['prompts_per_class']} prompts a class, {s['max_new_tokens']} tokens",
    ]
    for leg in f["temperatures"].values():
        lines.append(f"  {leg['title']}")
        for name, c in leg["classes"].items():
            ratio = "-" if c["plain_over_auto"] is None else f"{c['plain_over_auto']:.3f}x (least {c['least']:.2f}x)"
            steps = ", ".join(f"{m} {n}" for m, n in sorted(c["steps"].items()))
            lines.append(f"    {name:<9} {ratio:<24} steps: {steps}")
    return "\n".join(lines)
