"""How many drafts each step verifies: a fixed number, none, or `auto`; what `auto` knows to choose with.

`auto` picks, before each step, the verify size T (T - 1 drafts; T = 1 is a plain decode step) with the
most expected tokens per second (and, with several drafting methods, the method: engine/speculation.py),
from two things:
- the acceptance per draft position (`Acceptance`): the probability that draft j is accepted when drafts
  1..j-1 were, counted online with a decay, with a prior of PRIOR_WEIGHT observations that the decay never
  wears away. The first position's prior P depends on the decoding: greedy drafts land when they are the
  target's argmax, sampled ones with probability sum(min(p, q)), far less often, so each has its own.
  A later position's prior leans from P up toward the estimate of the one before it when that is higher,
  as far as the last position tried has been (t / (t + PRIOR_WEIGHT) of the way: a run of fully accepted
  short drafts makes longer ones look as good, one lucky draft does not), and otherwise TAIL_BLEND of the
  way down to it (drafts that keep failing early say the later ones would fail too), so a position far
  past the last one tried drifts back to P;
- the seconds of a step of each size, and of each method's draft for it, on this device and model (`Costs`):
  measured at warm-up, then refreshed from the step timings, a few steps' at a time (spec.COST_EVERY).
Expected tokens of a step verifying k drafts: 1 + sum_{j<=k} prod_{i<=j} a_i. A plain step teaches the
estimate nothing, so while plain steps win a short draft is tried now and then, less often each time it
does not pay.

Each drafting method keeps its own estimates (prompt lookup two: for short and for long matches), as its
drafts land differently; `PRIORS` holds each one's P.

The estimates belong to a conversation, not to the engine: a `DraftMemory` holds one conversation's, and
whoever keeps the conversation (runtime/answering.py) hands it to `Engine.generate` with each answer. A
new conversation's estimate starts from the engine's `Records`, shared by the conversations of one engine:
P blended with how the first drafts of the last few answers landed (a drafter that lands nothing on what
this user asks starts plain). Its tries of a short draft start PROBE_FIRST steps apart whatever the last
answers left: a new conversation is new text (after raw code that the drafter missed, a prose question it
drafts well waited 32 plain steps for its first try), and a try costs a fraction of one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_chat.engine import rules

DECAY = 0.97  # weight of an observation after each newer one at the same position (~33 steps of memory)
# per-position acceptance assumed before anything is seen (optimism costs a step or two; doubt, many), greedy and
# sampled, per estimate: a DFlash drafter's, the MTP layer's (chained drafts land less often the further they
# go, which the positions learn), prompt lookup's for short and for long matches (engine/lookup.py), a grammar's
# forced tokens in the answer's own tokens and in the tokenizer's
PRIORS = {
    "dflash": (0.85, 0.7),
    "mtp": (0.8, 0.6),
    "lookup": (0.5, 0.3),
    "lookup-long": (0.9, 0.7),
    "grammar": (0.8, 0.7),  # the tokens a grammar forces (engine/structured.py), as the answer wrote that text
    "grammar-text": (0.5, 0.4),  # the same, in the tokenizer's tokens: a target often writes them otherwise
}
PRIOR_GREEDY, PRIOR_SAMPLED = PRIORS["dflash"]
PRIOR_WEIGHT = 2.0  # pseudo-observations of the prior, in every position's estimate
TAIL_BLEND = 0.4  # how far a later position's prior leans from the first's down to a lower estimate before it
COST_ALPHA = 0.1  # weight of a new step timing in a size's cost
OUTLIER = 2.0  # a timing counts at most this many times (or this fraction of) its current figure
WARM_WEIGHT = 3  # loop timings the warm-up's figure of a size counts as (it is the best of three)
HELD = " held"  # after a method: its draft held to a grammar (engine/structured.py), read row by row on the host
PROBE_FIRST, PROBE_MAX = 8, 64  # plain steps between tries of a short draft: first, and at most
RECORD_DECAY = 0.7  # weight of an answer in a drafter's record after each newer one (~3 answers of memory)
RECORD_PRIOR = 1.0  # answers' worth of the fixed prior in a record


def parse_draft(value) -> str | int:
    """'auto', 'off', or a number of drafts per step (engine/rules.py's rule); anything else is rules.Invalid."""
    try:
        return rules.draft(value)
    except rules.Invalid as exc:
        raise rules.Invalid(f"draft {exc}") from None


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
    """Per draft position: decayed counts of the tries and the accepts; and, while other steps win (plain ones,
    or another method's), how many ran in a row and how many to run before the next try of a short draft
    (kept across a conversation's answers, so a conversation that drafts badly stops paying for tries)."""

    tries: list[float]
    hits: list[float]
    prior: float = PRIOR_SAMPLED  # the first position's (module docstring)
    idle: int = 0  # steps in a row this estimate's method did not draft
    probe_every: int = PROBE_FIRST
    whole: int = 0  # drafts of the last step when it accepted every one (0: it did not, or was plain)
    probed: bool = False  # the last step was a try of a short draft while plain steps won
    # `expected()` as last computed: auto reads it several times a step, and only `observe` changes it
    _expected: list[float] | None = field(default=None, init=False, repr=False, compare=False)

    def observe(self, drafted: int, accepted: int) -> None:
        """A step verified `drafted` drafts and accepted the first `accepted`: positions up to the first
        rejection were tried."""
        for j in range(min(accepted + 1, drafted)):
            self.tries[j] = self.tries[j] * DECAY + 1.0
            self.hits[j] = self.hits[j] * DECAY + (1.0 if j < accepted else 0.0)
        self.whole = drafted if accepted >= drafted else 0
        self._expected = None

    def rates(self) -> list[float]:
        P, weight = self.prior, PRIOR_WEIGHT
        out, before, seen = [], P, 0.0
        for h, t in zip(self.hits, self.tries, strict=True):
            lean = seen / (seen + weight) if before >= P else TAIL_BLEND
            before = (h + (P + lean * (before - P)) * weight) / (t + weight)
            seen = t or seen  # untried: the last tried's
            out.append(before)
        return out

    def expected_tokens(self, drafts: int) -> float:
        return self.expected()[drafts]

    def expected(self) -> list[float]:
        """Expected tokens of a step verifying k drafts, for every k from 0 (one pass over the rates; computed
        again only after an observation). The caller must not change the list."""
        if self._expected is None:
            out, run, total = [1.0], 1.0, 1.0
            for rate in self.rates():
                run *= rate
                total += run
                out.append(total)
            self._expected = out
        return self._expected


@dataclass
class Record:
    """A drafter's record at one decoding, across the engine's answers: what a new conversation's estimate
    starts from (module docstring). Each answer that drafted adds the share of its steps whose first draft
    landed, decayed by RECORD_DECAY an answer, beside RECORD_PRIOR answers of the fixed prior."""

    base: float  # the fixed prior: PRIORS[estimate][0 greedy, 1 sampled]
    answers: float = 0.0  # decayed count of answers that drafted
    landed: float = 0.0  # decayed sum of their first position's acceptance

    @classmethod
    def of(cls, greedy: bool, estimate: str = "dflash") -> Record:
        return cls(PRIORS[estimate][0 if greedy else 1])

    def prior(self) -> float:
        return (self.landed + self.base * RECORD_PRIOR) / (self.answers + RECORD_PRIOR)

    def fresh(self, positions: int) -> Acceptance:
        """A new conversation's estimate."""
        return Acceptance([0.0] * positions, [0.0] * positions, self.prior())

    def learn(self, accepted: list[int]) -> None:
        """An answer ended: `accepted[k]` of its steps with drafts accepted exactly k (a stats histogram)."""
        steps = sum(accepted)
        if steps:
            self.answers = self.answers * RECORD_DECAY + 1.0
            self.landed = self.landed * RECORD_DECAY + (steps - accepted[0]) / steps


@dataclass
class Records:
    """The records of an engine's estimates, one per estimate and decoding, shared by the conversations of one
    engine."""

    table: dict[tuple[str, bool], Record] = field(default_factory=dict)

    def of(self, greedy: bool, estimate: str = "dflash") -> Record:
        if (estimate, greedy) not in self.table:
            self.table[estimate, greedy] = Record.of(greedy, estimate)
        return self.table[estimate, greedy]


@dataclass
class DraftMemory:
    """What `auto` has learned of one conversation: an estimate per drafting method and decoding (greedy drafts
    land far more often than sampled ones), each started from `records` when the conversation first drafts
    that way."""

    records: Records = field(default_factory=Records)
    estimates: dict[tuple[str, bool], Acceptance] = field(default_factory=dict)

    def estimate(self, greedy: bool, positions: int, estimate: str = "dflash") -> Acceptance:
        if (estimate, greedy) not in self.estimates:
            self.estimates[estimate, greedy] = self.records.of(greedy, estimate).fresh(positions)
        return self.estimates[estimate, greedy]

    def learn(self, greedy: bool, accepted: list[int], estimate: str = "dflash") -> None:
        """An answer ended: the record of its decoding and estimate learns it (Record.learn)."""
        self.records.of(greedy, estimate).learn(accepted)


@dataclass
class Costs:
    """Seconds per step of each verify size (verify, accept and commit) and of each drafting method's draft for
    each size it drafts at (a DFlash draft of T - 1 runs the drafter's whole block but its LM head only on
    those rows; the MTP layer runs T - 1 times): the warm-up's figures times a drift common to every figure,
    times each one's own correction.

    A timing moves the common drift and its own correction alike: a machine that slows down (another
    process, a clock that drops) slows every size, and a size that is not run (plain steps while drafting
    wins) must follow it, or a stale figure could keep auto on one side for good. A timing counts at most
    OUTLIER times its figure either way: one step that a busy moment stretched must not turn auto around.
    A figure's first timings in the loop weigh as if the warm-up's figure were WARM_WEIGHT of them (1/4, 1/5,
    ... down to COST_ALPHA): a warm-up that a busy moment skewed is corrected within a few steps of the size.

    The drift scales every figure alike, so it changes no choice: auto weighs plans by the figures over it
    (`relative`), and a timing changes only the relative figures of its own kind and size. Those are kept
    between timings and only the tables that hold a timed size are made again (auto reads them every step,
    and each step times a verify and a draft: the loop hands them over a few steps at a time, `observe_all`)."""

    verify: dict[int, float]
    draft: dict[str, dict[int, float]]  # method -> verify size T (> 1) -> seconds of its draft for it
    drift: float = 1.0
    own: dict[tuple[str, int], float] = field(default_factory=dict)  # (kind, T) -> its own correction
    seen: dict[tuple[str, int], int] = field(default_factory=dict)  # (kind, T) -> timings counted
    # each kind's figures over the drift (warm-up figure times own correction): kind -> T -> seconds
    _now: dict[str, dict[int, float]] = field(default_factory=dict, init=False, repr=False, compare=False)
    # `relative` as computed: (method, sizes) -> its answer, dropped by a timing of a size in it (verify) or of
    # its method's draft at a size in it
    _tables: dict[tuple[str, tuple[int, ...]], dict[int, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _sizes: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def step(self, T: int, method: str = "dflash") -> float:
        return self.drift * self.relative_step(T, method)

    def relative_step(self, T: int, method: str = "dflash") -> float:
        """`step` over the drift."""
        return self.relative(self._upto(T), method)[T]

    def _upto(self, T: int) -> tuple[int, ...]:
        """The verify sizes below T, and T (what a step of T is floored by)."""
        sizes = self._sizes.get(T)
        if sizes is None:
            sizes = self._sizes[T] = tuple(sorted({size for size in self.verify if size < T} | {T}))
        return sizes

    def steps(self, sizes, method: str = "dflash") -> dict[int, float]:
        """Seconds of a step of each size (ascending) drafted by `method`, in one pass: each at least those of the
        sizes below it (more tokens never cost less; a warm-up that a busy moment hit measured the 8-token step
        below the 4-token one, and auto then started fresh answers at 8 drafts where 16 accept every one)."""
        drift = self.drift
        return {T: drift * seconds for T, seconds in self.relative(tuple(sizes), method).items()}

    def relative(self, sizes: tuple[int, ...], method: str = "dflash") -> dict[int, float]:
        """`steps` over the drift, kept until a timing changes it. The caller must not change the dict."""
        key = (method, sizes)
        out = self._tables.get(key)
        if out is None:
            verify, draft = self._figures("verify"), self._figures(method)
            out, floor = {}, 0.0
            for T in sizes:  # verify's seconds + the method's draft's
                floor = out[T] = max(floor, verify.get(T, 0.0) + draft.get(T, 0.0) if T > 1 else verify.get(T, 0.0))
            self._tables[key] = out
        return out

    def _figures(self, kind: str) -> dict[int, float]:
        """A kind's figures over the drift, T -> seconds (a held draft's warm-up figures are its method's)."""
        figures = self._now.get(kind)
        if figures is None:
            base = self.verify if kind == "verify" else self.draft.get(kind.removesuffix(HELD), {})
            figures = self._now[kind] = {T: s * self.own.get((kind, T), 1.0) for T, s in base.items()}
        return figures

    def verify_only(self, T: int) -> float:
        """Seconds of a verify of T alone (its draft already paid)."""
        return self.drift * self.relative_verify(T)

    def relative_verify(self, T: int) -> float:
        """`verify_only` over the drift."""
        return self._figures("verify").get(T, 0.0)

    def _base(self, kind: str, T: int) -> float:
        """The warm-up figure (a held draft's is its method's: the loop's timings give it its own correction)."""
        return (self.verify if kind == "verify" else self.draft.get(kind.removesuffix(HELD), {})).get(T, 0.0)

    def observe(self, kind: str, T: int, seconds: float) -> None:
        """A timing of a verify (`kind` "verify") or of a method's draft (`kind` the method) for size T."""
        self.observe_all([(kind, T, seconds)])

    def observe_all(self, timings: list[tuple[str, int, float]]) -> None:
        """Timings (kind, T, seconds) in the order they were taken, as `observe` takes each; the kept tables that
        read their figures are dropped once, after the last."""
        touched = set()
        for kind, T, seconds in timings:
            if self._count(kind, T, seconds):
                touched.add((kind, T))
        for kind, T in touched:
            self._forget(kind, T)

    def _count(self, kind: str, T: int, seconds: float) -> bool:
        """Move the drift and (kind, T)'s own correction by one timing; False for a figure the warm-up lacks."""
        base = self._base(kind, T)
        if base <= 0:
            return False
        own = self.own.get((kind, T), 1.0)
        expected = own * self.drift  # the timing's current figure over its warm-up one
        ratio = min(max(seconds / base, expected / OUTLIER), expected * OUTLIER)
        seen = self.seen[kind, T] = self.seen.get((kind, T), 0) + 1
        if not kind.endswith(HELD):  # a held draft's host work says nothing of the machine's drift
            self.drift += COST_ALPHA * (ratio / own - self.drift)
        own = self.own[kind, T] = own + max(COST_ALPHA, 1 / (seen + WARM_WEIGHT)) * (ratio / self.drift - own)
        self._figures(kind)[T] = base * own
        return True

    def _forget(self, kind: str, T: int) -> None:
        """Drop the kept tables that read the figure of (kind, T)."""
        stale = [key for key in self._tables if T in key[1] and kind in ("verify", key[0])]  # a handful of tables
        for key in stale:
            del self._tables[key]


@dataclass
class AutoDraft:
    """`auto`'s choice of size for one drafting method: the conversation's acceptance of it, the engine's costs."""

    sizes: list[int]  # verify sizes, ascending; 1 (a plain step) first when plain steps may be taken
    acceptance: Acceptance
    costs: Costs
    method: str = "dflash"

    def __post_init__(self) -> None:
        self._sizes = tuple(self.sizes)
        # (expected, seconds, size, rate) of the last `best`: kept while neither list is made again
        self._kept: tuple[list[float], dict[int, float], int, float] | None = None

    def best(self) -> tuple[int, float]:
        """(size, expected tokens per second at the warm-up's pace: Costs.relative) of the method's best drafting
        size; the size grown to the next one up after a step that accepted every draft (that says nothing of the
        positions past it, and a size that never runs never has its cost measured in the loop; a lucky try while
        other steps won is left to the estimate)."""
        a = self.acceptance
        expected = a.expected()
        seconds = self.costs.relative(self._sizes, self.method)
        kept = self._kept
        if kept is not None and kept[0] is expected and kept[1] is seconds:
            best, rate = kept[2], kept[3]
        else:
            best, rate = 0, 0.0
            for T in self._sizes:  # ascending: a tie goes to the shorter draft
                if T > 1 and (best == 0 or expected[T - 1] / seconds[T] > rate):
                    best, rate = T, expected[T - 1] / seconds[T]
            self._kept = (expected, seconds, best, rate)
        if a.whole and not a.probed:
            grown = next((T for T in self._sizes if T > 1 and T > a.whole + 1), self._sizes[-1])
            return max(best, grown), rate
        return best, rate

    def choose(self) -> int:
        """The verify size of the next step, this method being the only one: its best size, or a plain step
        when that is faster (with a try of a short draft now and then)."""
        T, rate = self.best()
        plain = 1 in self._sizes and 1 / self.costs.relative_step(1, self.method) >= rate
        return self.book(1 if plain else T)

    def book(self, T: int) -> int:
        """The step's size after T was chosen: T when the method drafts; when it does not (T = 1), a plain step,
        or, once it has not drafted for `probe_every` steps, a try of its shortest size (then the next try
        waits twice as long)."""
        a = self.acceptance
        a.probed = False
        if T > 1:
            a.idle, a.probe_every = 0, PROBE_FIRST
            return T
        a.idle += 1
        if a.idle >= a.probe_every:
            a.idle, a.probe_every, a.probed = 0, min(PROBE_MAX, 2 * a.probe_every), True
            return next(T for T in self.sizes if T > 1)
        return 1
