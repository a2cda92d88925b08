"""What this machine has, and which model pair and quants fit it.

`probe()` imports torch inside the function (never at import time) so the UI can
start first and probe in a worker. `choose()` is pure: it takes a `Machine`
(a probe double in tests) and the catalog, and returns a `Choice` with a
one-line explanation, e.g.
"RTX 3090 24 GiB: Qwen3.6-27B Q4_K_M + drafter Q8_0; 4.2 GB left for a 32k context", or, for a
DFlash2 drafter, with why it is the faster pair:
"RTX 3090 24 GiB: Qwen3.8-27B Q4_K_M + DFlash2 drafter Q8_0 (DFlash2 drafts 8-token blocks with ~20 %
longer acceptance); 3.69 GB left for a 32k context".

Pairs are tried by rank: the catalog ranks a pair above another where it runs faster when both fit
(Qwen3.8-27B + DFlash2 above Qwen3.6-27B + DFlash), so the first pair, quant and drafter that fit the
context asked for (the app's context_length setting, or --context) are the fastest that fit.

Memory needed = target weights + drafter weights + state for the context + workspace + margin.
Every term but the margin comes from engine/memory.py, the rules the engine sizes its buffers by
(state: KV caches, Gated DeltaNet state and its copies, RoPE tables, the drafter's context cache;
workspace: a prefill chunk or a verify step), in the dtype the engine computes in on that device.

The vision tower never changes the pick; `Choice.vision` says whether it loads beside it, and why
(models/vision_fit.py).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from dflash_chat.engine import memory
from dflash_chat.engine.memory import DrafterShape
from dflash_chat.errors import UserError
from dflash_chat.models.catalog import Catalog, CatalogError, Pair, Source
from dflash_chat.models.sizes import size_text
from dflash_chat.models.vision_fit import NO_VISION, VisionPick, plan_vision

GIB = 2**30
MARGIN_FRACTION = 0.05
MIN_MARGIN = GIB // 2
# Acceptance length of DFlash2 over DFlash, as its authors publish it (z-lab / Inco AI, Aug 2026: about
# +20 %, 21 % on their Qwen3.5-4B setup); the one-line reason quotes it.
DFLASH2_ACCEPTANCE_GAIN = "~20 %"


class NoFitError(UserError):
    """No pair/quant fits the memory there is; the message says what the smallest one needs."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total: int
    free: int

    @property
    def label(self) -> str:
        return f"{short_gpu_name(self.name)} {nominal_gib(self.total)} GiB"


@dataclass(frozen=True)
class Machine:
    gpus: tuple[Gpu, ...]
    ram_total: int
    ram_available: int
    cuda_note: str = ""  # why there is no GPU, when there is none

    @property
    def gpu(self) -> Gpu | None:
        """The GPU the engine will use: the one with the most free memory."""
        return max(self.gpus, key=lambda g: g.free, default=None)

    @property
    def device(self) -> str:
        gpu = self.gpu
        return f"cuda:{gpu.index}" if gpu else "cpu"

    @property
    def label(self) -> str:
        gpu = self.gpu
        return gpu.label if gpu else f"CPU, {nominal_gib(self.ram_total)} GiB RAM"

    @property
    def total(self) -> int:
        gpu = self.gpu
        return gpu.total if gpu else self.ram_total

    @property
    def available(self) -> int:
        gpu = self.gpu
        return gpu.free if gpu else self.ram_available

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of the dtype the engine computes in here (memory.compute_bytes)."""
        return memory.compute_bytes(self.device)


def nominal_gib(total: int) -> int:
    """The size a card or a RAM kit is sold as, in GiB, the unit it is sold in ('24' for an RTX 3090, which
    holds 24 GiB = 25.8 GB); measured figures go through sizes.size_text, in GB."""
    return round(total / GIB)


def planned(vram_gb: float, ram: Machine | None = None) -> Machine:
    """A machine with one GPU of `vram_gb` (the size it is sold as), all of it free: to plan for a
    card before buying it or before downloading for it (`dflash-chat models --vram`)."""
    total = int(vram_gb * GIB)
    ram_total, ram_available = (ram.ram_total, ram.ram_available) if ram else (0, 0)
    return Machine((Gpu(0, "planned GPU", total, total),), ram_total, ram_available)


def short_gpu_name(name: str) -> str:
    return re.sub(r"^(NVIDIA\s+)?(GeForce\s+)?", "", name).strip() or name


# --- probe -----------------------------------------------------------------------------------------


def probe() -> Machine:
    """GPUs (name, total and free memory) via torch.cuda, and RAM; no GPU means CPU."""
    gpus, note = _probe_gpus()
    total, available = _ram()
    return Machine(gpus, total, available, note)


def _probe_gpus() -> tuple[tuple[Gpu, ...], str]:
    try:
        import torch
    except ImportError as exc:
        return (), f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        build = "CPU-only build of torch" if torch.version.cuda is None else "no CUDA device visible"
        return (), build
    gpus = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        gpus.append(Gpu(index, torch.cuda.get_device_name(index), total, free))
    return tuple(gpus), ""


def _ram() -> tuple[int, int]:
    try:
        with open("/proc/meminfo") as handle:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in handle if ":" in line}
        return info["MemTotal"], info.get("MemAvailable", info["MemTotal"])
    except (OSError, KeyError, ValueError, IndexError):
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            total = 0
        return total, total


# --- memory arithmetic (the terms come from engine/memory.py) ----------------------------------------


def margin_bytes(total: int) -> int:
    return max(MIN_MARGIN, int(total * MARGIN_FRACTION))


@dataclass(frozen=True)
class Budget:
    target: int
    drafter: int
    state: int
    workspace: int
    margin: int
    available: int

    @property
    def need(self) -> int:
        return self.target + self.drafter + self.state + self.workspace + self.margin

    @property
    def fits(self) -> bool:
        return self.need <= self.available

    @property
    def left_for_context(self) -> int:
        """Memory left once weights, workspace and margin are placed: what holds the state."""
        return self.available - self.target - self.drafter - self.workspace - self.margin


def budget(pair: Pair, target: Source, drafter: Source | None, context: int, machine: Machine) -> Budget:
    e = machine.compute_bytes
    shape = drafter.shape if drafter else None
    return Budget(
        target=memory.weight_bytes(target.size, target.kind, e),
        drafter=memory.weight_bytes(drafter.size, drafter.kind, e) if drafter else 0,
        state=memory.state_bytes(pair.target_shape, shape, context, e).total,
        workspace=memory.workspace_bytes(pair.target_shape, shape, context, e),
        margin=margin_bytes(machine.total),
        available=machine.available,
    )


# --- choosing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    pair: Pair
    target: Source
    drafter: Source | None
    context: int
    device: str
    budget: Budget
    explanation: str
    vision: VisionPick = NO_VISION

    @property
    def fits(self) -> bool:
        return self.budget.fits

    @property
    def methods(self) -> tuple[str, ...]:
        """The drafting methods this pick has ("dflash" or "dflash2", "mtp", "lookup"): `speculate auto`
        chooses among them per step. (The loader has the last word: a file without an MTP layer has no `mtp`.)"""
        drafter = ("dflash2" if is_dflash2(self.drafter) else "dflash",) if self.drafter is not None else ()
        return (*drafter, *(("mtp",) if self.pair.has_mtp else ()), "lookup")

    @property
    def drafting(self) -> str:
        """Which methods the pick drafts with and why, in one line (`models` and `doctor` print it)."""
        names = [METHOD_NAMES[m] for m in self.methods]
        listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
        return f"drafts with {listed}, chosen per step by `speculate auto` ({drafting_why(self)})"


METHOD_NAMES = {
    "dflash": "the DFlash drafter",
    "dflash2": "the DFlash2 drafter",
    "mtp": "the target's own MTP layer",
    "lookup": "prompt lookup",
}


def drafting_why(choice: Choice) -> str:
    """Why the pick has the methods it has."""
    pair = choice.pair
    if choice.drafter is not None:
        reason = "the drafter fits beside this quant"
    elif not pair.drafters:
        reason = f"{pair.title} has no DFlash drafter"
    elif pair.mtp_first:
        reason = (
            "no drafter: on this MoE target the MTP layer drafts faster than a DFlash drafter, whose "
            "16-token verify wakes many experts"
        )
    else:
        reason = "no drafter: none fits beside this quant, and the MTP layer needs no download and almost no memory"
    mtp = "its checkpoints carry an MTP layer" if pair.has_mtp else "its checkpoints carry no MTP layer"
    return f"{reason}; {mtp}; prompt lookup needs no model"


def choose(
    machine: Machine,
    catalog: Catalog,
    *,
    model: str | None = None,
    quant: str | None = None,
    drafter_quant: str | None = None,
    context: int | None = None,
    target_file: str | Path | None = None,
    drafter_file: str | Path | None = None,
    allow_no_fit: bool = False,
    vision: str = "auto",
    mmproj_file: str | Path | None = None,
) -> Choice:
    """The best pair + target quant + drafter quant that fit, honouring every override given.

    Without overrides: pairs by rank (the cpu_default pair on CPU), target quants and then drafter
    quants in the catalog's order of preference (Q8_0 before Q4_K_M); the first that fits wins.
    When nothing fits, the smallest option is returned (with an explanation that says it will not
    fit) if the user pinned everything (model and quants, or files) or `allow_no_fit` is set;
    otherwise that is an error. The vision tower (`vision` "auto" or "off"; `mmproj_file` a tower for the pick's
    target) loads where it fits beside the pick: see models/vision_fit.py.
    """
    if context is not None and context < 256:
        raise UserError(f"--context must be at least 256 tokens, got {context}")
    target_local = _file_source(Path(target_file), "target") if target_file is not None else None
    drafter_local = _file_source(Path(drafter_file), "drafter") if drafter_file is not None else None
    pairs = _candidate_pairs(machine, catalog, model, target_local, drafter_local, drafter_quant)
    pair_given = model is not None or target_file is not None or drafter_file is not None
    target_given = quant is not None or target_file is not None
    drafter_given = drafter_quant is not None or drafter_file is not None or not pairs[0].drafters
    pinned = pair_given and target_given and drafter_given
    tried: list[Choice] = []
    for pair in pairs:
        ctx = _context_for(pair, context, explicit=pair_given)
        if ctx is None:
            continue
        for target in _targets(pair, quant, target_local):
            for drafter in _drafters(pair, drafter_quant, drafter_local):
                choice = _make_choice(machine, pair, target, drafter, ctx)
                if choice.fits:
                    return _with_vision(choice, machine, vision, mmproj_file)
                tried.append(choice)
    if not tried:
        raise NoFitError(f"no model supports {_a_ctx(context or 0)} context; try a shorter --context")
    smallest = min(tried, key=lambda c: c.budget.need)
    if pinned or allow_no_fit:
        return _with_vision(smallest, machine, vision, mmproj_file)
    raise NoFitError(
        f"{machine.label}: nothing fits in the {size_text(machine.available)} free; the smallest option, "
        f"{_parts(smallest)} with {_a_ctx(smallest.context)} context, needs "
        f"{size_text(smallest.budget.need)}. Try a shorter --context, close other programs using "
        f"{'the GPU' if machine.gpu else 'memory'}, or pick a model and quant yourself (--model, --quant)."
    )


def _with_vision(choice: Choice, machine: Machine, setting: str, mmproj_file: str | Path | None) -> Choice:
    where = f"{_a_ctx(choice.context)} context"
    tower = plan_vision(choice.pair, choice.target, choice.budget, where, machine.compute_bytes, setting, mmproj_file)
    return replace(choice, vision=tower)


def _candidate_pairs(
    machine: Machine,
    catalog: Catalog,
    model: str | None,
    target_local: Source | None,
    drafter_local: Source | None,
    drafter_quant: str | None,
) -> list[Pair]:
    if model is not None:
        return [catalog.get(model)]
    if target_local is not None:
        return [_pair_for_file(catalog, target_local.local_path)]
    if drafter_local is not None:  # a drafter only works beside its own target
        return [_pair_for_file(catalog, drafter_local.local_path)]
    ranked = list(catalog.ranked())
    if machine.gpu is None:
        cpu = [p for p in ranked if p.cpu_default]
        ranked = cpu or ranked[-1:]
    if drafter_quant is None:
        return ranked
    # No pair named: only the pairs that publish this drafter quant are candidates.
    having = [p for p in ranked if drafter_quant.lower() in (q.lower() for q in p.drafter_quants)]
    if not having:
        known = ", ".join(dict.fromkeys(q for p in ranked for q in p.drafter_quants))
        raise CatalogError(
            f"no model has drafter quant {drafter_quant} (known: {known}); "
            "pick one of those, or add --model NAME (see `dflash-chat models`)"
        )
    return having


def _pair_for_file(catalog: Catalog, path: Path) -> Pair:
    """The catalog pair a model file belongs to, from its name ('Qwen3.6-27B-Q5_K_M.gguf' -> Qwen3.6-27B)."""
    name = path.name.lower()
    for pair in sorted(catalog.pairs, key=lambda p: -len(p.title)):
        if pair.title.lower() in name:
            return pair
    titles = ", ".join(p.title for p in catalog.pairs)
    raise UserError(f"cannot tell which model {path.name} is (expected one of {titles} in its name); add --model NAME")


def _context_for(pair: Pair, context: int | None, explicit: bool) -> int | None:
    ctx = context or pair.default_context
    if ctx <= pair.max_context:
        return ctx
    if explicit:
        raise UserError(
            f"{pair.title} supports at most {pair.max_context} tokens of context; --context {ctx} is too long"
        )
    return None


def _targets(pair: Pair, quant: str | None, target_local: Source | None) -> list[Source]:
    if target_local is not None:
        return [target_local]
    if quant is not None:
        return [pair.target(quant)]
    return list(pair.targets)


def _drafters(pair: Pair, drafter_quant: str | None, drafter_local: Source | None) -> list[Source | None]:
    if drafter_local is not None:
        return [pair.local_drafter(drafter_local.local_path)]
    if drafter_quant is not None:
        return [pair.drafter(drafter_quant)]
    if not pair.has_mtp:
        return list(pair.drafters) or [None]
    # a target with its own MTP layer can draft alone: after every drafter (where none fits beside this
    # quant), or first where the catalog says it drafts faster (mtp_first: the MoE target)
    return [None, *pair.drafters] if pair.mtp_first else [*pair.drafters, None]


def _file_source(path: Path, role: str) -> Source:
    path = path.expanduser()
    if not path.exists():
        raise UserError(f"--{role}-file {path}: no such file. Check the path.")
    return Source.local(path)


def _make_choice(machine: Machine, pair: Pair, target: Source, drafter: Source | None, ctx: int) -> Choice:
    b = budget(pair, target, drafter, ctx, machine)
    parts = _parts_of(pair, target, drafter)
    if b.fits:
        text = (
            f"{machine.label}: {parts}{_why(pair, drafter)}; {size_text(b.left_for_context)} left for "
            f"{_a_ctx(ctx)} context"
        )
    else:
        text = (
            f"{machine.label}: {parts} with {_a_ctx(ctx)} context needs {size_text(b.need)}, "
            f"only {size_text(b.available)} free: it will not fit"
        )
    return Choice(pair, target, drafter, ctx, machine.device, b, text)


def _parts(choice: Choice) -> str:
    return _parts_of(choice.pair, choice.target, choice.drafter)


def _parts_of(pair: Pair, target: Source, drafter: Source | None) -> str:
    t = f"{target.path.name} (local file)" if target.path else f"{pair.title} {target.quant}"
    if drafter is None:
        return f"{t} alone, drafting with its own MTP layer" if pair.has_mtp else f"{t}, no drafter"
    d = f"{drafter.path.name} (local)" if drafter.path else drafter.quant
    kind = "DFlash2 drafter" if is_dflash2(drafter) else "drafter"
    return f"{t} + {kind} {d}"


def is_dflash2(drafter: Source | None) -> bool:
    return _dflash2_shape(drafter) is not None


def _dflash2_shape(drafter: Source | None) -> DrafterShape | None:
    """The shape of a DFlash2 drafter; None for a DFlash one, or none."""
    shape = drafter.shape if drafter is not None else None
    return shape if shape is not None and shape.kind == "dflash2" else None


def _why(pair: Pair, drafter: Source | None) -> str:
    """Why a DFlash2 pair is the pick: what makes it faster than the DFlash pairs below it; why a target with
    a drafter in the catalog runs alone."""
    if drafter is None and pair.has_mtp and pair.drafters:
        return (
            " (MoE: its MTP layer drafts faster than a DFlash drafter here)"
            if pair.mtp_first
            else " (no drafter fits beside it)"
        )
    shape = _dflash2_shape(drafter)
    if shape is None:
        return ""
    return f" (DFlash2 drafts {shape.block_size}-token blocks with {DFLASH2_ACCEPTANCE_GAIN} longer acceptance)"


def context_label(context: int) -> str:
    return f"{context // 1024}k" if context >= 1024 and context % 1024 == 0 else str(context)


def _a_ctx(context: int) -> str:
    """'a 32k', 'an 8k', 'an 11k': the article as the number is spoken."""
    label = context_label(context)
    digits = label.removesuffix("k")
    spoken_vowel = digits.startswith("8") or (len(digits) % 3 == 2 and digits[:2] in ("11", "18"))
    return f"{'an' if spoken_vowel else 'a'} {label}"


# --- command-line flags shared by the commands that pick a model ------------------------------------


def add_choice_arguments(parser: argparse.ArgumentParser, *, files: bool = True) -> None:
    """The flags that pin the choice; `files`: also --target-file/--drafter-file (the chat, not `models`)."""
    from dflash_chat.settings import flag

    group = parser.add_argument_group("model choice (default: the best that fits this machine)")
    group.add_argument("--model", help="model pair name from `dflash-chat models`")
    group.add_argument("--quant", help="target quant, e.g. Q8_0 or Q4_K_M")
    group.add_argument("--drafter-quant", help="drafter quant, e.g. Q8_0, Q4_K_M or BF16")
    group.add_argument(
        "--context",
        type=flag("context_length"),
        help="context length in tokens, 256-1048576 (default: the context_length setting for the chat, each model's own for models/pull)",
    )
    group.add_argument(
        "--vision",
        type=flag("vision"),
        metavar="auto|off",
        help="the vision tower, which reads images: auto loads it where it fits beside the model, off never "
        "(default: the vision setting)",
    )
    if files:
        group.add_argument("--target-file", help="a target GGUF you already have (llama.cpp, LM Studio)")
        group.add_argument("--drafter-file", help="a drafter GGUF file or safetensors folder you already have")
        group.add_argument(
            "--mmproj",
            metavar="FILE",
            dest="mmproj_file",
            help="the vision tower (mmproj-*.gguf) for a target GGUF you point at (--target or --target-file)",
        )
