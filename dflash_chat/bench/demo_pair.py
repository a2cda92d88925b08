"""`dflash-chat bench --demo`: what a user of the demo pair gets, per kind of prompt, method, draft and temperature.
One file past 500 lines: the classes, the interleaved runs and the report share one figures dict, made and shown here.

Four classes of prompts on the embedded demo pair (a tiny target trained on the Python standard
library, its own MTP layer inside its safetensors, and its DFlash drafters):
- code: the held-out code questions (chat template; the items they ask about were kept out of training),
- raw_code: the start of a Python function, sent as is without the chat template (as `run --raw` does),
- prose: plain English questions (chat template), which the demo was not trained for,
- copy: copy-heavy chat prompts, asking to repeat or lightly edit a given code block or paragraph,
- image: questions about a picture (a shape drawn with Pillow, at --image's size), read by the demo's vision
  tower. That tower is random (train/vision.py): the class proves the path (the tower, the features in the prompt,
  M-RoPE) and that every method's greedy output is plain decoding's on image prompts, not what the tower sees.
The raw-code, prose and copy prompts are data beside the held-out prompts (demo_data/bench_prompts.json).

Engines over the one loaded target decode every prompt: plain (speculate none: the baseline, the same
engine code); each method alone at fixed depth: each shipped drafter (DFlash, and DFlash2 when it ships)
at a fixed 16-token verify (draft 15, or its block), the target's MTP layer chained 1, 2 and 3 deep, and
prompt lookup at up to 15 drafts; and `auto` (the app's defaults: speculate auto, draft auto) beside each
drafter. Each prompt is decoded by all of them in turn before the next,
so drift on the machine hits them alike, and that `--repeats` times (3 by default): the repeat with the
median decode time per token counts, so one busy moment of the machine does not move a figure. Each
prompt (and repeat) is its own conversation (its own draft memory for auto, which starts from the drafter's
records of its earlier answers, as a new chat's does); auto's engine keeps its step costs, and its records
last over all answers, as the app's do. The greedy leg
(temperature 0) checks every engine's text against plain decoding's, token for token; the sampled leg runs
at the app's defaults (settings.py) or the given --temperature/--top-p/--top-k, with seed i for the
i-th prompt of each class (repeatable for a fixed draft setting; auto's choices follow measured step
times, so its draws may differ between runs). `goals` sums up what the issue that added the methods asks of
them (lossless per method and class, copy-heavy speedups, auto against plain and the best single method,
MTP per depth).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dflash_chat.bench.comparison import Comparison, Divergence, Run, Totals, _divergence, generate, median_run
from dflash_chat.engine.draft_length import DraftMemory, Records
from dflash_chat.engine.events import MethodStats
from dflash_chat.models.demo import DRAFTER_DIRS

PROMPTS_FILE = "bench_prompts.json"
DRAFTS = (15, "auto")  # the DFlash settings measured against plain decoding
MTP_DEPTHS = (1, 2, 3)  # the MTP layer chained this deep, each its own engine
LOOKUP_DRAFTS = 15  # prompt lookup's fixed setting: up to this many drafts where a match is found
PLAIN = "plain"  # the key of plain decoding's runs beside the draft settings'
DRAFTER_LABELS = {"dflash": "DFlash", "dflash2": "DFlash2", "mtp": "MTP", "lookup": "lookup"}
DRAFT_LABELS = {"15": "fixed 16", "auto": "auto"}  # by the setting as the engine writes it (stats.draft)


def draft_key(kind: str, draft) -> str:
    """A draft setting's key in the JSON: "15" / "auto" for the DFlash drafter, "dflash2/15" for another."""
    return str(draft) if kind == "dflash" else f"{kind}/{draft}"


def draft_label(key: str) -> str:
    kind, _, draft = key.rpartition("/")
    if kind == "mtp":
        return f"MTP depth {draft}"
    if kind == "lookup":
        return f"lookup {draft}"
    label = DRAFT_LABELS.get(draft, draft)
    return f"{DRAFTER_LABELS.get(kind, kind)} {label}" if kind else label


def method_of(key: str) -> str:
    """The method a key's engine drafts with: "auto" for the app's setting, else the drafter or method."""
    kind, _, draft = key.rpartition("/")
    return "auto" if draft == "auto" else kind or "dflash"


CLASSES = {
    "code": "held-out code questions (chat template)",
    "raw_code": "raw code, no chat template",
    "prose": "prose questions (chat template; not what the demo was trained for)",
    "copy": "copy-heavy: repeat or lightly edit a given code block or paragraph (chat template)",
    "image": "image questions, a drawn shape each (chat template; the demo's vision tower is random: proves the path "
    "and the exactness, not what it sees)",
}
IMAGE_QUESTIONS = (
    "What shape is in this picture?",
    "What colour is the shape in this image?",
    "Describe this picture in one sentence.",
    "Is there a triangle in this image?",
)
IMAGE_SIZE = (128, 96)  # 12 tokens at the demo tower's pixel budget
DRAFT_NOTES = {
    "15": "a drafter alone (speculate dflash), fixed: 15 drafts verified per step (a 16-token verify; a drafter "
    "with a smaller block drafts its block - 1)",
    "auto": "the app's defaults (speculate auto, draft auto): per step the method (the drafter, the MTP layer, "
    "prompt lookup) and its drafts (0: a plain step), by expected tokens/s",
    "mtp/N": "the target's MTP layer alone (speculate mtp), chained N deep every step",
    "lookup/15": "prompt lookup alone (speculate lookup): up to 15 drafts where the text's end matches earlier "
    "text, else a plain step",
}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def key(self) -> str:
        """The leg's key in the JSON: the temperature as written ("0", "0.7")."""
        return format(self.temperature, "g")

    def params(self, max_new_tokens: int, seed: int | None):
        """The engine's SamplingParams for one answer of this leg (`seed`: its draws, when sampled)."""
        from dflash_chat.engine.sampling_params import SamplingParams

        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=max_new_tokens,
            seed=None if self.greedy else seed,
        )

    @property
    def title(self) -> str:
        if self.greedy:
            return "temperature 0 (greedy)"
        return f"temperature {self.key}, top-p {self.top_p:g}, top-k {self.top_k}"


def sampling_legs(temperature: float | None, top_p: float | None, top_k: int | None) -> list[Sampling]:
    """Greedy, then the sampled leg: the app's defaults where a flag is not given. `--temperature 0`
    asks for the greedy leg only (and then --top-p/--top-k have nothing to shape)."""
    from dflash_chat.errors import UserError
    from dflash_chat.settings import Settings

    if temperature == 0:
        if top_p is not None or top_k is not None:
            raise UserError(
                "--temperature 0 runs the greedy leg only: leave out --top-p and --top-k, "
                "or give a temperature above 0 for the sampled leg"
            )
        return [Sampling()]
    app = Settings()
    sampled = Sampling(
        app.temperature if temperature is None else temperature,
        app.top_p if top_p is None else top_p,
        app.top_k if top_k is None else top_k,
    )
    return [Sampling(), sampled]


def bench_prompts() -> dict[str, list[str]]:
    """The raw-code and prose prompts shipped beside the demo pair."""
    from dflash_chat.models.demo import demo_dir

    data = json.loads((demo_dir() / PROMPTS_FILE).read_text())
    return {name: list(data[name]) for name in ("raw_code", "prose", "copy")}


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt with images: its ids (each image's placeholders expanded) and the images, prepared for the tower."""

    ids: list[int]
    images: tuple


def drawn_shape(index: int, size: tuple[int, int]):
    """A Pillow image of one shape (circle, square or triangle, in turn) in a colour, on white."""
    from PIL import Image, ImageDraw

    w, h = size
    image = Image.new("RGB", size, "white")
    box = (w // 4, h // 4, 3 * w // 4, 3 * h // 4)
    colour = ("red", "green", "blue", "orange")[index % 4]
    draw = ImageDraw.Draw(image)
    shape = index % 3
    if shape == 0:
        draw.ellipse(box, fill=colour)
    elif shape == 1:
        draw.rectangle(box, fill=colour)
    else:
        draw.polygon([(w // 2, box[1]), (box[2], box[3]), (box[0], box[3])], fill=colour)
    return image


def image_prompts(tokenizer, vision, per_class: int, sizes=()) -> list[ImagePrompt]:
    """The image class's prompts: each question with a drawn shape (at `sizes` in turn; default IMAGE_SIZE), as the
    chat renders a message with an image."""
    from dflash_chat.runtime.images import image_part
    from dflash_chat.runtime.prompt import build_prompt

    sizes = list(sizes) or [IMAGE_SIZE]
    out = []
    for i, question in enumerate(IMAGE_QUESTIONS[:per_class]):
        turn = {
            "role": "user",
            "content": [image_part(drawn_shape(i, sizes[i % len(sizes)])), {"type": "text", "text": question}],
        }
        prompt = build_prompt(tokenizer, [turn], thinking=False, vision=vision)
        out.append(ImagePrompt(prompt.ids, prompt.images))
    return out


def prompt_classes(tokenizer, per_class: int, vision=None, image_sizes=()) -> dict[str, list[Any]]:
    """Token ids of the first `per_class` prompts of each class, as the app (or `run --raw`) encodes them; the image
    class (ImagePrompt each) only with `vision` (runtime/images.py Vision: the pair reads images)."""
    from dflash_chat.models.demo import demo_heldout_prompts
    from dflash_chat.runtime.prompt import build_prompt, encode

    data = bench_prompts()
    chats = {"code": demo_heldout_prompts()}
    chats |= {name: [[{"role": "user", "content": q}] for q in data[name]] for name in ("prose", "copy")}
    out: dict[str, list[Any]] = {
        name: [build_prompt(tokenizer, chat, thinking=False).ids for chat in chats[name][:per_class]] for name in chats
    }
    out["raw_code"] = [encode(tokenizer, text) for text in data["raw_code"][:per_class]]
    if vision is not None:
        out["image"] = image_prompts(tokenizer, vision, per_class, image_sizes)
    return {name: out[name] for name in CLASSES if name in out}


def run(
    *, prompts: int, max_new_tokens: int, legs: list[Sampling], device: str = "cpu", repeats: int = 1, image_sizes=()
) -> dict:
    """Every class, leg and draft setting against plain decoding; the figures as one JSON-ready dict. Each
    answer runs `repeats` times and the one with the median decode time per token counts (`median_run`).
    `image_sizes`: (width, height) the image class's pictures are drawn at, in turn."""
    import torch

    from dflash_chat.engine.load import load_drafter, load_pair
    from dflash_chat.engine.spec import Engine
    from dflash_chat.models.demo import chosen_kind, demo_drafters, demo_paths, demo_vision
    from dflash_chat.runtime.images import Vision
    from dflash_chat.settings import Settings

    target_dir, _ = demo_paths()
    plain = load_pair(
        target_dir,
        None,
        device=device,
        dtype=torch.float32,
        draft="off",
        speculate="none",
        vision=demo_vision() or False,
    )  # float32: greedy bit-comparable
    target = plain.engine.target
    tower, image_token = plain.engine.vision, plain.engine.image_token_id

    def make_engine(drafter=None, **settings) -> Engine:
        return engine_beside(plain.engine, target_dir, drafter, **settings)

    drafters = demo_drafters()
    engines = {
        draft_key(kind, draft): make_engine(
            load_drafter(folder, target), draft=draft, speculate="dflash" if draft != "auto" else "auto"
        )
        for kind, folder in drafters.items()
        for draft in DRAFTS
    }
    has_mtp = plain.engine.mtp is not None
    if has_mtp:
        engines |= {f"mtp/{k}": make_engine(draft=k, speculate="mtp") for k in MTP_DEPTHS}
    engines[f"lookup/{LOOKUP_DRAFTS}"] = make_engine(draft=LOOKUP_DRAFTS, speculate="lookup")
    tok = plain.tokenizer
    vision = Vision(tower, image_token) if tower is not None and image_token is not None else None
    classes = prompt_classes(tok, prompts, vision, image_sizes)

    every = ((PLAIN, plain.engine), *engines.items())
    records = {key: Records() for key, _ in every}  # each engine's, as the app's answering service keeps
    warm_up(every, classes["code"][0], legs, max_new_tokens, records)

    app = Settings()
    figures = {}
    identical = True
    for leg in legs:
        per_class = {}
        for name, ids in classes.items():
            comparisons = {key: Comparison() for key in engines}
            for i, prompt in enumerate(ids):
                runs = interleaved_runs(every, prompt, leg.params(max_new_tokens, i), records, repeats)
                ar = median_run(runs[PLAIN])
                for draft in engines:
                    c = comparisons[draft]
                    c.ar.append(ar)
                    c.spec.append(median_run(runs[draft]))
                    if leg.greedy:
                        parted = next((s.tokens for s in runs[draft] if s.tokens != ar.tokens), None)
                        if parted is not None:
                            c.divergences.append(_parted(plain.engine, i, prompt, ar.tokens, parted))
            if leg.greedy:
                identical &= all(c.identical for c in comparisons.values())
            per_class[name] = _class_figures(name, comparisons, leg.greedy)
        figures[leg.key] = {
            **leg_header(leg),
            "app_defaults": not leg.greedy and leg == Sampling(app.temperature, app.top_p, app.top_k),
            "classes": per_class,
        }
    setup = {
        **run_setup(plain.device, classes, max_new_tokens, repeats),
        "baseline": "plain decoding: the same engine with draft off, on the same loaded target",
        "order": "per prompt: plain, then each draft setting, before the next prompt",
        "timing": "each answer run `repeats` times (plain and every draft setting in turn, then again); the one "
        "with the median decode seconds per token counts",
        "conversation": "each prompt, and each repeat, its own conversation (auto's draft memory starts "
        "from the drafter's records of its earlier answers, as a new chat's does)",
        "drafts": DRAFT_NOTES,
        "drafters": {kind: folder.name for kind, folder in drafters.items()},
        "demo_drafter": chosen_kind(),
        "classes": CLASSES,
    }
    setup["mtp"] = has_mtp
    if "image" in classes:
        setup["image_sizes"] = [list(size) for size in image_sizes or [IMAGE_SIZE]]  # drawn at, in turn
    return {
        "setup": setup,
        "temperatures": figures,
        "identical": identical,
        "faster": faster_drafter(figures),
        "goals": goals(figures, chosen_kind()),
    }


def engine_beside(plain, target_dir, drafter=None, **settings):
    """An Engine over `plain`'s loaded target (its context, end ids and vision tower) with its own MTP layer and
    `drafter`: each engine holds its own drafting caches."""
    from dflash_chat.engine.load import load_mtp
    from dflash_chat.engine.spec import Engine

    return Engine(
        plain.target,
        drafter,
        mtp=load_mtp(target_dir, plain.target),
        max_context=plain.max_context,
        end_ids=plain.end_ids,
        vision=plain.vision,
        image_token_id=plain.image_token_id,
        **settings,
    )


def faster_drafter(figures: dict) -> dict:
    """Each drafter's mean speedup at `auto` (the app's draft setting) over every class and temperature, and
    the faster: the one `--demo` should run (demo.json)."""
    speedups: dict[str, list[float]] = {}
    for leg in figures.values():
        for c in leg["classes"].values():
            for key, d in c["drafts"].items():
                kind, _, draft = key.rpartition("/")
                if draft == "auto" and (kind or "dflash") in DRAFTER_DIRS:
                    speedups.setdefault(kind or "dflash", []).append(d["speedup"])
    means = {kind: sum(v) / len(v) for kind, v in speedups.items()}
    return {"at": "auto", "mean_speedup": means, "drafter": max(means, key=lambda kind: means[kind]) if means else None}


def goals(figures: dict, demo_kind: str) -> dict:
    """What the figures say of the methods' goals: per leg and class, each engine's greedy output against plain
    decoding's, auto's speedup (the app's defaults beside the demo's drafter) against plain and against the
    best single method at its best fixed depth, and on the copy-heavy class lookup's and auto's speedups."""
    auto_key = draft_key(demo_kind, "auto")
    out: dict = {"auto": auto_key, "legs": {}}
    for leg_key, leg in figures.items():
        per_class = {}
        for name, c in leg["classes"].items():
            drafts = c["drafts"]
            single = {key: d["speedup"] for key, d in drafts.items() if method_of(key) != "auto"}
            best = max(single, key=lambda key: single[key]) if single else None
            auto = drafts.get(auto_key, {}).get("speedup")
            row = {
                "auto_vs_plain": auto,
                "best_single": best,
                "best_single_vs_plain": single.get(best) if best else None,
                "auto_vs_best_single": auto / single[best] if auto and best and single[best] else None,
            }
            if leg["greedy"]:
                row["identical"] = {key: d["identical"] for key, d in drafts.items()}
            if name == "copy":
                row["lookup_vs_plain"] = drafts.get(f"lookup/{LOOKUP_DRAFTS}", {}).get("speedup")
            row["mtp"] = {
                key.removeprefix("mtp/"): {"tau": d["tau"], "vs_plain": d["speedup"]}
                for key, d in drafts.items()
                if key.startswith("mtp/")
            }
            per_class[name] = row
        out["legs"][leg_key] = per_class
    return out


def warm_up(every, first: list[int], legs: list[Sampling], max_new_tokens: int, records: dict) -> None:
    """First calls pay for allocations (and auto for measuring its step costs): one untimed answer to `first`
    per leg from each (key, engine) of `every`."""
    for leg in legs:
        for key, engine in every:
            _answer(engine, first, leg.params(max_new_tokens, 0), DraftMemory(records[key]))


def interleaved_runs(every, prompt: list[int], params, records: dict, repeats: int) -> dict[str, list[Run]]:
    """Each (key, engine) of `every` answers `prompt` `repeats` times, each answer a new chat, the engines in
    turn (a busy stretch of the machine hits every setting alike): key -> its runs."""
    runs: dict[str, list[Run]] = {key: [] for key, _ in every}
    for _ in range(repeats):
        for key, engine in every:
            runs[key].append(_answer(engine, prompt, params, DraftMemory(records[key])))
    return runs


def _answer(engine, prompt, params, memory: DraftMemory) -> Run:
    """`prompt`: token ids, or an ImagePrompt."""
    engine.reset()  # each prompt from an empty state, as compare() does: no prefix reuse between prompts
    if isinstance(prompt, ImagePrompt):
        return generate(engine, prompt.ids, params, memory, images=prompt.images)
    return generate(engine, prompt, params, memory)


def _parted(engine, index: int, prompt, ar: list[int], parted: list[int]) -> Divergence:
    """Where a greedy answer parted from plain decoding's; an image prompt's logit gap is not measured (the target
    alone cannot read its images), so it never passes for a near tie."""
    if not isinstance(prompt, ImagePrompt):
        return _divergence(engine, index, prompt, ar, parted)
    position = next((j for j, (a, b) in enumerate(zip(ar, parted, strict=False)) if a != b), min(len(ar), len(parted)))
    return Divergence(index, position, float("nan"))


def _class_figures(name: str, comparisons: dict, greedy: bool) -> dict:
    return {"title": CLASSES[name], "chat_template": name != "raw_code", **class_figures(comparisons, greedy)}


def class_figures(comparisons: dict, greedy: bool) -> dict:
    """One class's figures: plain decoding's, and each draft setting's against it (`comparisons` by key)."""
    any_c = next(iter(comparisons.values()))
    drafts = {}
    for draft, c in comparisons.items():
        drafts[str(draft)] = {
            "tau": c.mean_acceptance_length,
            "acceptance_rate": c.acceptance_rate,
            "tokens_per_s": c.spec_tokens_per_s,
            "speedup": c.speedup,
            "median_speedup": c.median_speedup,
            "per_prompt_speedup": c.speedups,
            "mean_draft_length": c.mean_draft_length,
            "identical": c.identical if greedy else None,
            "divergences": [vars(d) for d in c.divergences],
            "new_tokens": c.new_tokens,
            "acceptance_histogram": c.acceptance_histogram,
            "draft_histogram": c.draft_histogram,
            "draft_ms_per_step": c.draft_ms_per_step,
            "verify_ms_per_step": c.verify_ms_per_step,
            "host_us_per_step": c.host_us_per_step,
            "methods": _methods(c.spec),
        }
    return {
        "prompts": len(any_c.ar),
        "plain": {
            "tokens_per_s": any_c.ar_tokens_per_s,
            "new_tokens": Totals.of(any_c.ar).new_tokens,
            "image_tokens": sum(r.stats.image_tokens for r in any_c.ar),
            "ms_per_step": any_c.ar_ms_per_step,
            "host_us_per_step": any_c.ar_host_us_per_step,
        },
        "drafts": drafts,
    }


def _methods(runs: list[Run]) -> dict:
    """Each method's steps, drafts, acceptance, share of the steps and the decode loop's host time per step (µs),
    over `runs` (plain steps as "plain")."""
    totals: dict[str, MethodStats] = {}
    steps = 0
    for r in runs:
        steps += r.stats.steps
        for name, m in r.stats.methods.items():
            t = totals.setdefault(name, MethodStats())
            t.steps, t.drafted, t.accepted = t.steps + m.steps, t.drafted + m.drafted, t.accepted + m.accepted
            t.host_s += m.host_s
    return {name: t.as_dict(steps) | {"host_us_per_step": 1e6 * t.host_s / t.steps} for name, t in totals.items()}


def format_report(f: dict) -> str:
    s = f["setup"]
    counts = ", ".join(f"{n} {name}" for name, n in s["prompts_per_class"].items())
    threads = f", {_count(s['threads'], 'CPU thread')}" if s["threads"] else ""
    lines = [
        "embedded demo pair (real trained drafters, the target's own MTP layer); plain decoding and each drafting "
        "method with the same engine, per prompt in turn",
        f"prompts: {counts}; {s['max_new_tokens']} new tokens at most, thinking off, {s['device']} {s['dtype']}{threads}"
        + (f"; each answer the median of {s['repeats']} runs" if s.get("repeats", 1) > 1 else "")
        + (f"; {_count(s['load'], 'busy process')} beside it (--load)" if s.get("load") else ""),
        "fixed 16: a drafter alone, 15 drafts verified per step; MTP depth N: the MTP layer alone, N drafts; "
        "lookup 15: prompt lookup alone; auto: the app's defaults, method and drafts chosen per step (0 = a plain "
        "step); τ: tokens per step; speed: decode tok/s over plain's (all prompts, and the median per prompt); host: "
        "the decode loop's time per step around the model calls (choosing, bookkeeping, stats; per method for auto)",
    ]
    for leg in f["temperatures"].values():
        title = Sampling(leg["temperature"], leg["top_p"], leg["top_k"]).title
        if not leg["greedy"]:
            title += (
                " (the app's defaults)" if leg["app_defaults"] else ""
            ) + ", seed = the prompt's index in its class"
        lines += ["", title]
        for c in leg["classes"].values():
            lines.append(
                f"  {c['title']}: {_count(c['prompts'], 'prompt')}, plain decode {c['plain']['tokens_per_s']:.1f} tok/s"
                + _host(c["plain"])
            )
            for key, d in c["drafts"].items():
                label = draft_label(key)
                row = (
                    f"    {label:<16} {d['tokens_per_s']:7.1f} tok/s  {d['speedup']:5.2f}x (median {d['median_speedup']:.2f}x)"
                    f"  τ {d['tau']:5.2f}  acceptance {d['acceptance_rate']:6.1%}  mean draft {d['mean_draft_length']:5.2f}"
                )
                row += _host(d)
                if d["identical"] is not None:
                    row += f"  identical: {'yes' if d['identical'] else 'NO'}"
                if method_of(key) == "auto" and d.get("methods"):
                    row += "  steps: " + ", ".join(
                        f"{m} {v['share']:.0%}{_host(v, '')}" for m, v in d["methods"].items()
                    )
                lines.append(row)
    faster = f.get("faster") or {}
    if len(faster.get("mean_speedup") or {}) > 1:
        means = ", ".join(f"{DRAFTER_LABELS.get(k, k)} {v:.2f}x" for k, v in faster["mean_speedup"].items())
        lines += [
            "",
            f"faster drafter at auto (mean speedup over every class and temperature): "
            f"{DRAFTER_LABELS.get(faster['drafter'], faster['drafter'])} ({means})",
        ]
    lines += _goal_lines(f.get("goals"))
    lines += ["", f"identical greedy output: {'yes' if f['identical'] else 'NO: a method changed the output (a bug)'}"]
    return "\n".join(lines)


def _host(figures: dict, unit: str = "/step") -> str:
    """The decode loop's host time per step, where the figures have it (older JSON does not)."""
    us = figures.get("host_us_per_step")
    return "" if us is None else f" (host {us:.0f} µs{unit})"


def _goal_lines(g: dict | None) -> list[str]:
    if not g:
        return []
    lines = ["", f"auto ({draft_label(g['auto'])}) against plain and against the best single method at fixed depth:"]
    for leg_key, classes in g["legs"].items():
        for name, row in classes.items():
            if row["auto_vs_plain"] is None or row["best_single"] is None:
                continue
            line = (
                f"  T={leg_key} {name:<9} auto {row['auto_vs_plain']:.2f}x plain, best single "
                f"{draft_label(row['best_single'])} {row['best_single_vs_plain']:.2f}x -> auto "
                f"{row['auto_vs_best_single']:.2f}x the best"
            )
            if row.get("lookup_vs_plain") is not None:
                line += f"; lookup {row['lookup_vs_plain']:.2f}x plain"
            lines.append(line)
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def leg_header(leg: Sampling) -> dict:
    """How one temperature leg of a bench samples, as its JSON says it."""
    return {
        "temperature": leg.temperature,
        "top_p": leg.top_p,
        "top_k": leg.top_k,
        "greedy": leg.greedy,
        "seeds": None if leg.greedy else "prompt index within its class",
    }


def run_setup(device, classes: dict, max_new_tokens: int, repeats: int) -> dict:
    """Where and how a demo bench ran (`device`: a torch device): the pair, the threads, each class's prompts."""
    import torch

    from dflash_chat.models.demo import DEMO_NAME

    return {
        "pair": DEMO_NAME,
        "device": str(device),
        "dtype": "float32",
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "prompts_per_class": {name: len(items) for name, items in classes.items()},
        "max_new_tokens": max_new_tokens,
        "thinking": False,
        "repeats": repeats,
    }
