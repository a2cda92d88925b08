"""How many drafts each step verifies: a fixed number, none, or `auto`.

`auto` picks, before each step, the verify size T (T - 1 drafts; T = 1 is a plain decode step) with the
most expected tokens per second, from
- the acceptance per draft position: the probability that draft j is accepted when drafts 1..j-1 were,
  counted online with a decay, per conversation (the engine keeps one estimate per conversation key),
  with a fixed prior of PRIOR_WEIGHT observations at PRIOR that the decay never wears away (a position
  not tried for a while drifts back to it, so a run of short drafts does not hide that longer ones
  would now pay); a new conversation starts from the prior (another conversation's acceptance says
  little about this one's, and a doubtful start costs far more than an optimistic one: a step or two
  of failed drafts against many plain steps before a try);
- the seconds of a step of each size on this device and model: measured at warm-up, then refreshed from
  the step timings (an exponential average).
Expected tokens of a step verifying k drafts: 1 + sum_{j<=k} prod_{i<=j} a_i. A plain step teaches the
estimate nothing, so while plain steps win, a short draft is tried now and then, less often each time it
does not pay (the cost stays a few percent of plain decoding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.97  # weight of an observation after each newer one at the same position (~33 steps of memory)
PRIOR = 0.8  # per-position acceptance assumed before anything is seen (optimism costs a step or two; doubt, many)
PRIOR_WEIGHT = 2.0  # pseudo-observations of the prior, in every position's estimate
COST_ALPHA = 0.1  # weight of a new step timing in a size's cost
DRAFT = 0  # the draft's key among the verify sizes' (which start at 1)
PROBE_FIRST, PROBE_MAX = 8, 64  # plain steps between tries of a short draft: first, and at most


def parse_draft(value) -> str | int:
    """'auto', 'off', or a number of drafts per step (>= 1); anything else is a ValueError that says so."""
    if isinstance(value, bool):
        raise ValueError(f"draft must be auto, off or a number of drafts per step, not {value!r}")
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip().lower()
        if text in ("auto", "off"):
            return text
        try:
            number = int(text)
        except ValueError:
            raise ValueError(f"draft must be auto, off or a number of drafts per step, not {value!r}") from None
    if number < 1:
        raise ValueError(f"draft must be auto, off or a number of drafts per step (1 or more), not {value!r}")
    return number


def verify_sizes(draft: str | int, block: int) -> list[int]:
    """The verify sizes a draft setting uses with a drafter of `block` tokens (1: a plain step)."""
    if draft == "off" or block <= 1:
        return [1]
    if draft != "auto":
        return [min(int(draft), block - 1) + 1]
    sizes, T = [1], 4
    while T < block:
        sizes.append(T)
        T *= 2
    return sizes + [block]


@dataclass
class Acceptance:
    """Per draft position: decayed counts of the tries and the accepts; and, while plain steps win, how many
    ran in a row and how many to run before the next try of a short draft (kept across a conversation's
    answers, so a conversation that drafts badly stops paying for tries)."""

    tries: list[float]
    hits: list[float]
    plain_run: int = 0
    probe_every: int = PROBE_FIRST

    @classmethod
    def fresh(cls, positions: int) -> Acceptance:
        return cls([0.0] * positions, [0.0] * positions)

    def observe(self, drafted: int, accepted: int) -> None:
        """A step verified `drafted` drafts and accepted the first `accepted`: positions up to the first
        rejection were tried."""
        for j in range(min(accepted + 1, drafted)):
            self.tries[j] = self.tries[j] * DECAY + 1.0
            self.hits[j] = self.hits[j] * DECAY + (1.0 if j < accepted else 0.0)

    def rates(self) -> list[float]:
        return [(h + PRIOR * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT) for h, t in zip(self.hits, self.tries)]

    def expected_tokens(self, drafts: int) -> float:
        total, run = 1.0, 1.0
        for rate in self.rates()[:drafts]:
            run *= rate
            total += run
        return total


@dataclass
class Costs:
    """Seconds per step of each verify size (verify, accept and commit) and of a draft: the warm-up's figures
    times a drift common to every size, times each size's own correction.

    A size's timing moves the common drift and its own correction alike: a machine that slows down (another
    process, a clock that drops) slows every size, and a size that is not run (plain steps while drafting
    wins) must follow it, or a stale figure could keep auto on one side for good."""

    verify: dict[int, float]
    draft: float
    drift: float = 1.0
    own: dict[int, float] = field(default_factory=dict)  # verify size (DRAFT: the draft) -> its own correction

    def step(self, T: int) -> float:
        return self.drift * (self._seconds(T) + (self._seconds(DRAFT) if T > 1 else 0.0))

    def _base(self, key: int) -> float:
        return self.draft if key == DRAFT else self.verify[key]

    def _seconds(self, key: int) -> float:
        return self._base(key) * self.own.get(key, 1.0)

    def observe(self, kind: str, T: int, seconds: float) -> None:
        key = DRAFT if kind == "draft" else T
        if key != DRAFT and key not in self.verify:
            return
        base = self._base(key)
        if base <= 0:
            return
        ratio = seconds / base
        own = self.own.get(key, 1.0)
        self.drift += COST_ALPHA * (ratio / own - self.drift)
        self.own[key] = own + COST_ALPHA * (ratio / self.drift - own)


@dataclass
class AutoDraft:
    """`auto`'s choice for one answer: the conversation's acceptance, the engine's costs."""

    sizes: list[int]
    acceptance: Acceptance
    costs: Costs

    def choose(self) -> int:
        """The verify size of the next step."""
        a = self.acceptance
        rate = {T: a.expected_tokens(T - 1) / self.costs.step(T) for T in self.sizes}
        best = max(self.sizes, key=lambda T: rate[T])
        if best > 1:
            a.plain_run, a.probe_every = 0, PROBE_FIRST
            return best
        a.plain_run += 1
        if len(self.sizes) > 1 and a.plain_run >= a.probe_every:
            a.plain_run, a.probe_every = 0, min(PROBE_MAX, 2 * a.probe_every)
            return self.sizes[1]
        return 1
