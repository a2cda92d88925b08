"""Measuring DFlash against autoregressive decoding with the same engine, in one run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from dflash_chat.engine.events import AcceptanceFigures, Finished, GenerationStats, Step


@dataclass
class Run:
    tokens: list[int]
    stats: GenerationStats


@dataclass
class Totals(AcceptanceFigures):
    """The counts of several runs added up, so the figures are over all of them."""

    accepted: int
    drafted: int
    new_tokens: int
    steps: int
    decode_s: float
    draft_s: float
    verify_s: float
    answers: int
    host_s: float = 0.0  # the decode loop's host seconds outside the model calls (GenerationStats.host_s)

    @classmethod
    def of(cls, runs: list[Run]) -> Totals:
        def total(name: str):
            return sum(getattr(r.stats, name) for r in runs)

        return cls(
            total("accepted"),
            total("drafted"),
            total("new_tokens"),
            total("steps"),
            total("decode_s"),
            total("draft_s"),
            total("verify_s"),
            answers=len(runs),
            host_s=total("host_s"),
        )

    def ms_per_step(self, seconds: float) -> float:
        return 1000 * seconds / self.steps if self.steps else 0.0

    @property
    def host_us_per_step(self) -> float:
        return 1e6 * self.host_s / self.steps if self.steps else 0.0


# top-2 logit gap below which rounding may legitimately pick either token: a 16-token verify and a
# 1-token step sum in different orders. 16-bit logits carry ~3 significant digits, float32 ~7.
NEAR_TIE = {"float32": 1e-3, "float64": 1e-6, "bfloat16": 0.25, "float16": 0.05}


@dataclass
class Divergence:
    prompt: int
    position: int
    logit_gap: float  # the target's top-2 logit gap where the outputs part
    dtype: str = "float32"

    @property
    def near_tie(self) -> bool:
        return self.logit_gap < NEAR_TIE.get(self.dtype, 1e-3)


@dataclass
class Comparison:
    ar: list[Run] = field(default_factory=list)
    spec: list[Run] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.divergences

    @property
    def lossless(self) -> bool:
        """Identical, or parted only where the target's top two tokens tie to within float rounding."""
        return all(d.near_tie for d in self.divergences)

    @property
    def new_tokens(self) -> int:
        return Totals.of(self.spec).new_tokens

    @property
    def acceptance_histogram(self) -> list[int]:
        """Verify steps by number of accepted drafts, over all prompts."""
        columns = zip(*(r.stats.acceptance_histogram for r in self.spec), strict=True)
        return [sum(c) for c in columns]

    @property
    def ar_tokens_per_s(self) -> float:
        return Totals.of(self.ar).decode_tokens_per_s

    @property
    def spec_tokens_per_s(self) -> float:
        return Totals.of(self.spec).decode_tokens_per_s

    @property
    def speedup(self) -> float:
        return self.spec_tokens_per_s / self.ar_tokens_per_s if self.ar_tokens_per_s else 0.0

    @property
    def speedups(self) -> list[float]:
        """Per prompt: DFlash's decode tok/s over plain decoding's (prompts where either decoded nothing are left out)."""
        return [
            s.stats.decode_tokens_per_s / a.stats.decode_tokens_per_s
            for a, s in zip(self.ar, self.spec, strict=True)
            if a.stats.decode_tokens_per_s and s.stats.decode_tokens_per_s
        ]

    @property
    def median_speedup(self) -> float:
        return statistics.median(self.speedups) if self.speedups else 0.0

    @property
    def acceptance_rate(self) -> float:
        return Totals.of(self.spec).acceptance_rate

    @property
    def mean_acceptance_length(self) -> float:
        return Totals.of(self.spec).mean_acceptance_length

    @property
    def mean_draft_length(self) -> float:
        return Totals.of(self.spec).mean_draft_length

    @property
    def draft_histogram(self) -> list[int]:
        """Steps by number of drafts verified (0: a plain step), over all prompts."""
        columns = zip(*(r.stats.draft_histogram for r in self.spec), strict=True)
        return [sum(c) for c in columns]

    @property
    def draft_ms_per_step(self) -> float:
        spec = Totals.of(self.spec)
        return spec.ms_per_step(spec.draft_s)

    @property
    def verify_ms_per_step(self) -> float:
        spec = Totals.of(self.spec)
        return spec.ms_per_step(spec.verify_s)

    @property
    def ar_ms_per_step(self) -> float:
        ar = Totals.of(self.ar)
        return ar.ms_per_step(ar.verify_s)

    @property
    def host_us_per_step(self) -> float:
        """The decode loop's host time per step around the model calls (µs), over all prompts."""
        return Totals.of(self.spec).host_us_per_step

    @property
    def ar_host_us_per_step(self) -> float:
        return Totals.of(self.ar).host_us_per_step

    def as_dict(self) -> dict:
        return {
            "prompts": len(self.ar),
            "new_tokens": self.new_tokens,
            "acceptance_histogram": self.acceptance_histogram,
            "identical_output": self.identical,
            "divergences": [vars(d) for d in self.divergences],
            "lossless": self.lossless,
            "ar_tokens_per_s": self.ar_tokens_per_s,
            "dflash_tokens_per_s": self.spec_tokens_per_s,
            "speedup": self.speedup,
            "median_speedup": self.median_speedup,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "mean_draft_length": self.mean_draft_length,
            "ar_ms_per_step": self.ar_ms_per_step,
            "draft_ms_per_step": self.draft_ms_per_step,
            "verify_ms_per_step": self.verify_ms_per_step,
            "ar_host_us_per_step": self.ar_host_us_per_step,
            "host_us_per_step": self.host_us_per_step,
        }


def generate(engine, prompt, params, memory=None, images=()) -> Run:
    tokens: list[int] = []
    stats = None
    for event in engine.generate(prompt, params, memory=memory, images=images):
        if isinstance(event, Step):
            tokens.extend(event.token_ids)
        elif isinstance(event, Finished):
            stats = event.stats
    assert stats is not None, "a generation ends with its Finished event"
    return Run(tokens, stats)


def median_run(runs: list[Run]) -> Run:
    """Of one answer's repeats, the one with the median decode seconds per token (the faster of two): a moment
    the machine was busy stretches one repeat, not the figure."""
    ranked = sorted(runs, key=lambda r: r.stats.decode_s / max(r.stats.new_tokens, 1))
    return ranked[(len(ranked) - 1) // 2]


def compare(ar_engine, spec_engine_for, prompts, params, warmup: bool = True) -> Comparison:
    """AR on each prompt, then DFlash from `spec_engine_for(prompt, ar_tokens)`; greedy outputs must match."""
    if warmup:  # first calls pay for allocations and kernel selection
        warm = generate(ar_engine, prompts[0], params)
        generate(spec_engine_for(prompts[0], warm.tokens), prompts[0], params)
    result = Comparison()
    for i, prompt in enumerate(prompts):
        ar_engine.reset()
        ar = generate(ar_engine, prompt, params)
        spec_engine = spec_engine_for(prompt, ar.tokens)
        spec_engine.reset()
        spec = generate(spec_engine, prompt, params)
        result.ar.append(ar)
        result.spec.append(spec)
        if spec.tokens != ar.tokens:
            result.divergences.append(_divergence(ar_engine, i, prompt, ar.tokens, spec.tokens))
    return result


def _divergence(engine, index: int, prompt: list[int], ar: list[int], spec: list[int]) -> Divergence:
    import torch

    position = next((j for j, (a, b) in enumerate(zip(ar, spec, strict=False)) if a != b), min(len(ar), len(spec)))
    state = engine.target.new_state(len(prompt) + position + 1)
    ids = torch.tensor(prompt + ar[:position], dtype=torch.long, device=engine.device)
    logits, _ = engine.target(ids, state, logits="last")
    top = logits.float().topk(2).values
    dtype = str(engine.target.model.norm.weight.dtype).removeprefix("torch.")
    return Divergence(index, position, float(top[0] - top[1]), dtype)


def report(c: Comparison, title: str) -> str:
    if c.identical:
        verdict = "yes"
    elif c.lossless:
        gaps = ", ".join(f"{d.logit_gap:.1e}" for d in c.divergences)
        verdict = (
            f"no, {len(c.divergences)} prompt(s) parted where the target's top two logits tie to within "
            f"{c.divergences[0].dtype} rounding (gap {gaps}): a 16-token verify and a 1-token step round "
            "differently; afterwards the drafter's reference no longer matches, so acceptance is understated"
        )
    else:
        verdict = "NO: DFlash changed the output (a bug)"
    lines = [
        title,
        f"  prompts {len(c.ar)}, identical greedy output: {verdict}",
        f"  autoregressive  {c.ar_tokens_per_s:8.1f} tok/s   {c.ar_ms_per_step:7.2f} ms/step",
        f"  DFlash          {c.spec_tokens_per_s:8.1f} tok/s   draft {c.draft_ms_per_step:.2f} ms + verify {c.verify_ms_per_step:.2f} ms per step",
        f"  speedup         {c.speedup:8.2f}x",
        f"  acceptance rate {c.acceptance_rate:8.1%}   mean acceptance length {c.mean_acceptance_length:.2f} tokens/step",
    ]
    return "\n".join(lines)
