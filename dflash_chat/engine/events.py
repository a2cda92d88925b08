"""What `Engine.generate` yields: plain dataclasses, no torch, so the UI can import them freely."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prefilled:
    prompt_tokens: int
    reused_tokens: int
    seconds: float


@dataclass(slots=True)
class Step:
    """One verify step (or one autoregressive step): the tokens it committed, and which method drafted them
    ("dflash", "mtp", "lookup"; "plain" for a step without drafts). Not frozen: the decode loop makes one every
    step, and a frozen dataclass's __init__ sets each field through object.__setattr__ (several microseconds
    a step once the model's forward has left the host's caches cold)."""

    token_ids: list[int]
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    method: str = "plain"


@dataclass
class MethodStats:
    """One drafting method's part of an answer: its steps, the drafts they verified and accepted."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    host_s: float = 0.0  # the decode loop's host seconds in its steps, outside the model calls (GenerationStats)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self, all_steps: int) -> dict:
        return {
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "share": self.steps / all_steps if all_steps else 0.0,
            "host_s": self.host_s,
        }


class AcceptanceFigures:
    """The acceptance and speed figures, for anything counting `accepted`, `drafted`, `new_tokens`,
    `steps` and `decode_s` over `answers` answers (one, unless it sums several)."""

    accepted: int
    drafted: int
    new_tokens: int
    steps: int
    decode_s: float
    answers = 1

    @property
    def decoded_tokens(self) -> int:
        """New tokens the decode steps produced: each answer's first token comes from its prefill."""
        return self.new_tokens - self.answers

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens over drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens produced per verify step (accepted drafts + the target's own token)."""
        return self.decoded_tokens / self.steps if self.steps else 0.0

    @property
    def mean_draft_length(self) -> float:
        """Drafts verified per step (0 for plain decoding)."""
        return self.drafted / self.steps if self.steps else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens after the first, over the time spent producing them."""
        produced = self.decoded_tokens
        return produced / self.decode_s if produced > 0 and self.decode_s > 0 else 0.0


@dataclass
class GenerationStats(AcceptanceFigures):
    prompt_tokens: int = 0
    reused_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # decode steps (verify steps with a drafter); the prefill's first token is not one
    drafted: int = 0
    accepted: int = 0
    # acceptance_histogram[k] = number of steps with drafts that accepted exactly k drafted tokens
    acceptance_histogram: list[int] = field(default_factory=list)
    # draft_histogram[k] = number of steps that verified k drafts (0: a plain decode step)
    draft_histogram: list[int] = field(default_factory=list)
    draft: str = "off"  # the draft setting: "auto", "off" or a number of drafts per step
    speculate: str = "none"  # the speculate setting: "auto", "dflash", "mtp", "lookup" or "none"
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    peak_memory_bytes: int = 0
    speculative: bool = False
    constraint_s: float = 0.0  # host seconds in the answer's grammar (masks, walking drafts); 0 when unconstrained
    forced_drafts: int = 0  # drafts the grammar forced (its only allowed token), free to verify
    image_tokens: int = 0  # the prompt's tokens that are images' (counted in prompt_tokens too)
    vision_s: float = 0.0  # seconds the vision tower ran for the prompt's images (within prefill_s)
    # host seconds of the decode loop outside the model calls (the steps' entry points and their host reads):
    # choosing each step's plan, bookkeeping, stats; not the time the caller holds each Step event
    host_s: float = 0.0

    def __post_init__(self) -> None:
        # per method ("plain" too: the steps without drafts), in the order the answer first used them; no field,
        # so the history keeps only the flat figures it knows
        self.methods: dict[str, MethodStats] = {}

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_histogram": list(self.acceptance_histogram),
            "draft": self.draft,
            "mean_draft_length": self.mean_draft_length,
            "draft_histogram": list(self.draft_histogram),
            "constraint_s": self.constraint_s,
            "forced_drafts": self.forced_drafts,
            "image_tokens": self.image_tokens,
            "vision_s": self.vision_s,
            "prefill_s": self.prefill_s,
            "ttft_s": self.ttft_s,
            "decode_s": self.decode_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "host_s": self.host_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "speculative": self.speculative,
            "speculate": self.speculate,
            "methods": {name: figures.as_dict(self.steps) for name, figures in self.methods.items()},
        }

    def count(self, step: Step) -> None:
        """Add a decode step to the figures (its method's too)."""
        self.steps += 1
        self.new_tokens += len(step.token_ids)
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.draft_histogram[step.drafted] += 1
        if step.drafted:
            self.acceptance_histogram[step.accepted] += 1
        figures = self.methods.setdefault(step.method, MethodStats())
        figures.steps += 1
        figures.drafted += step.drafted
        figures.accepted += step.accepted

    def count_host(self, method: str, seconds: float) -> None:
        """Add the decode loop's host seconds of a step of `method` (counted already) to the figures."""
        self.host_s += seconds
        self.methods[method].host_s += seconds


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" | "length" | "cancelled" | "error"
    stats: GenerationStats
    error: str | None = None


Event = Prefilled | Step | Finished
