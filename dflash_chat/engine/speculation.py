"""Which method drafts each step, and how far: a DFlash(2) drafter, the target's MTP layer, prompt lookup, or none.

The `speculate` setting (`--speculate`): "auto" (the default) chooses per step among the methods the loaded
pair has; "dflash", "mtp" or "lookup" drafts with that one only; "none" decodes plainly. The draft setting
(draft_length.py) says how far: "auto" chooses per step too, a number fixes the drafts (at most what the
method drafts: a DFlash drafter its block - 1, the MTP layer MTP_MOST and lookup LOOKUP_MOST, neither
more than a drafter's block - 1 when there is one), "off" decodes
plainly.

`auto` (both settings auto) takes, for every step, the plan with the most expected tokens per second: a
plain step, or a method at one of its sizes, each rated by the conversation's acceptance of that method
(draft_length.Acceptance, one estimate per method) over the step's measured cost (draft_length.Costs: the
verify of that size plus that method's draft for it). A model's draft is queued before the previous step's
tokens are read, so the device never waits for the host; prompt lookup needs those tokens, so it is weighed
after the read, against the queued plan with that plan's draft already paid: a long match found in the
tokens just read pre-empts a model draft for that step. While prompt lookup is drafting (a copy in progress)
no model draft is queued: the next step waits for the read, and a model drafts only if lookup has nothing
better. A method that does not win is tried at its shortest size now and then, less often each time it does
not pay (draft_length.AutoDraft.book), so a change of text finds the method that now wins. In an answer held to a
grammar (engine/structured.py), the tokens it forces are a method of their own (`grammar`, with its estimate):
a step's plan is reweighed once they are known (`Chooser.forced`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_chat.engine import rules
from dflash_chat.engine.draft_length import HELD, AutoDraft, Costs, verify_sizes
from dflash_chat.engine.errors import MissingMethod
from dflash_chat.engine.lookup import Match

METHODS = ("dflash", "mtp", "lookup")  # the drafting methods, in the order a tie goes
MODELS = ("dflash", "mtp")  # the methods whose drafts a model computes on the device
PLAIN = "plain"
GRAMMAR = "grammar"  # drafts a grammar forces (engine/structured.py): no model, accepted with certainty
GRAMMAR_TEXT = "grammar-text"  # their estimate when they are the tokenizer's tokens, not the answer's own
MTP_MOST = 7  # most drafts the MTP layer chains (a fixed draft setting)
MTP_AUTO = (1, 2, 3)  # the MTP depths `auto` chooses among: chained drafts land less often the further they go
LOOKUP_MOST = 15  # most drafts a lookup proposes
LOOKUP_AUTO = (1, 3, 7, 15)  # the lookup lengths `auto` chooses among
LONG_MATCH = 8  # a match of at least this many tokens is a long one: it has its own estimate


@dataclass(frozen=True)
class Plan:
    """One step: `method` drafts T - 1 tokens (T = 1: a plain step); `estimate`: the acceptance estimate it
    learns from (a method's, or lookup's for its match length); `tokens`: lookup's proposal (or the grammar's)."""

    method: str
    T: int
    estimate: str = ""
    tokens: tuple[int, ...] = ()

    @property
    def drafts(self) -> int:
        return self.T - 1


PLAIN_STEP = Plan(PLAIN, 1)


_MISSING = {
    "dflash": "speculate dflash needs a DFlash drafter, and this pair has none: load one (--drafter, or a model "
    "pair with one), or use auto, mtp or lookup",
    "mtp": "speculate mtp needs the target's own MTP layer, and its checkpoint carries none (no mtp.* or "
    "blk.N.nextn.* tensors): use auto, dflash or lookup",
}


def parse_speculate(value, most: dict[str, int] | None = None) -> str:
    """The speculate setting (engine/rules.py's rule; anything else is rules.Invalid); with `most`, the methods
    the pair has, a method it lacks is a MissingMethod that says so."""
    try:
        value = rules.speculate(value)
    except rules.Invalid as exc:
        raise rules.Invalid(f"speculate {exc}") from None
    if most is not None and value in _MISSING and value not in most:
        raise MissingMethod(_MISSING[value])
    return value


def method_sizes(speculate: str, draft: str | int, most: dict[str, int]) -> dict[str, list[int]]:
    """The verify sizes T (> 1) each method in use drafts at, from the two settings and `most`: each method
    the pair has -> the most drafts it can make. A method the setting names must be there (the caller says
    which is missing)."""
    if draft == "off" or speculate == "none":
        return {}
    chosen = most if speculate == "auto" else {speculate: most[speculate]}
    if draft != "auto":
        return {method: [min(int(draft), limit) + 1] for method, limit in chosen.items()}
    auto = {
        "dflash": lambda limit: verify_sizes("auto", limit + 1)[1:],
        "mtp": lambda limit: [k + 1 for k in MTP_AUTO if k <= limit],
        "lookup": lambda limit: [k + 1 for k in LOOKUP_AUTO if k <= limit],
    }
    return {method: auto[method](limit) for method, limit in chosen.items()}


def width(speculate: str, most: dict[str, int]) -> int:
    """Tokens a verify takes at most under the speculate setting (whatever the draft setting): what the state
    is allocated for."""
    if speculate == "none":
        return 1
    return 1 + (max(most.values()) if speculate == "auto" else most[speculate])


def available(drafter_block: int | None, mtp: bool) -> dict[str, int]:
    """The methods a pair has -> the most drafts each makes: a DFlash drafter of `drafter_block` tokens (None:
    none), the target's MTP layer (`mtp`), prompt lookup (always; as far as the drafter's block when there is
    one, so lookup widens no verify and the state stays the drafter's size)."""
    most = {"dflash": drafter_block - 1} if drafter_block else {}
    if mtp:
        most["mtp"] = min(MTP_MOST, drafter_block - 1) if drafter_block else MTP_MOST
    return most | {"lookup": drafter_block - 1 if drafter_block else LOOKUP_MOST}


def takes_plain_steps(draft: str | int, sizes: dict[str, list[int]]) -> bool:
    """Whether plain steps are taken: `auto` decides per step, and lookup has nothing to draft without a match
    (a fixed number of drafts by a model drafts every step)."""
    return draft == "auto" or not any(method in sizes for method in MODELS)


def estimate_of(method: str, match: Match | None = None) -> str:
    """The acceptance estimate a method's draft learns from: its own, lookup's for short or for long matches."""
    if method == "lookup" and match is not None and match.length >= LONG_MATCH:
        return "lookup-long"
    return method


class Chooser:
    """The plans of one answer's steps (module docstring), from the conversation's estimates and the engine's
    costs. `estimate(key)` gives the conversation's estimate of an estimate key (draft_length.DraftMemory);
    `fixed`: the draft setting is a number (each method drafts at its one size; nothing is tried); `held`: the
    answer is held to a grammar (a model's drafts cost what held drafts do: draft_length.HELD). Plans are rated in
    tokens per second at the warm-up's pace (draft_length.Costs.relative): the costs' drift changes no choice."""

    def __init__(
        self, sizes: dict[str, list[int]], plain: bool, costs: Costs | None, estimate, fixed: bool, held: bool = False
    ):
        self.sizes, self.plain, self.costs, self.estimate, self.fixed = sizes, plain, costs, estimate, fixed
        self.models = [m for m in MODELS if m in sizes]
        self.lookup = "lookup" in sizes
        self.held = held
        # built once an answer: a conversation's estimates stay its own
        self._autos: dict[str | tuple[str, int], AutoDraft] = {}
        self._plans: dict[tuple[str, int], Plan] = {}  # a model method's plan of each size (plans are values)
        self._models: list[tuple[str, AutoDraft]] | None = None

    def _cost_kind(self, method: str) -> str:
        """The costs' name of a method's drafts in this answer."""
        return method + HELD if self.held and method in MODELS else method

    def _auto(self, key: str, method: str, sizes: list[int] | None = None) -> AutoDraft:
        """The AutoDraft of an estimate `key` for `method` at `sizes` (None: the method's own), made once."""
        at = (key, len(sizes)) if sizes is not None else key  # a subset of a method's sizes is their first n
        auto = self._autos.get(at)
        if auto is None:
            assert self.costs is not None, "weighing plans needs the step costs"
            sizes = self.sizes[method] if sizes is None else sizes
            auto = self._autos[at] = AutoDraft(
                ([1] if self.plain else []) + sizes, self.estimate(key), self.costs, self._cost_kind(method)
            )
        return auto

    def _plan(self, method: str, T: int) -> Plan:
        plan = self._plans.get((method, T))
        if plan is None:
            plan = self._plans[method, T] = Plan(method, T, method)
        return plan

    def _model_autos(self) -> list[tuple[str, AutoDraft]]:
        """Each model method with its AutoDraft (made at the first plan weighed)."""
        autos = self._models
        if autos is None:
            autos = self._models = [(method, self._auto(method, method)) for method in self.models]
        return autos

    def _model_plans(self) -> list[tuple[float, Plan]]:
        """(expected tokens per second, plan) of a plain step and of each model method at its best size."""
        assert self.costs is not None
        plans = [(1 / self.costs.relative_step(1), PLAIN_STEP)] if self.plain else []
        for method, auto in self._model_autos():
            T, rate = auto.best()
            plans.append((rate, self._plan(method, T)))
        return plans

    def before_read(self, lookup_drafting: bool) -> Plan | None:
        """The plan whose draft is queued before the read: a model's, or a plain step; None to wait for the read
        (lookup drafts the step now: it will likely go on, or there is no model)."""
        if self.lookup and (lookup_drafting or not self.models):
            return None
        if self.costs is None:  # one model method at a fixed size
            return self._plan(self.models[0], self.sizes[self.models[0]][0]) if self.models else PLAIN_STEP
        best, plan = -1.0, PLAIN_STEP
        for rate, candidate in self._model_plans():  # ties: plain, then METHODS' order
            if rate > best:
                best, plan = rate, candidate
        return plan if self.fixed else self._booked(plan)

    def _booked(self, plan: Plan) -> Plan:
        """Book the step with every model method: the winner drafts, one that has not drafted for long enough
        drafts its shortest size instead, as a try (AutoDraft.book)."""
        chosen = plan
        for method, auto in self._model_autos():
            T = auto.book(plan.T if method == plan.method else 1)
            if T > 1 and method != plan.method and chosen is plan:
                chosen = self._plan(method, T)
        return chosen

    def after_read(self, queued: Plan | None, match: Match | None) -> Plan:
        """The step's plan once the tokens before it are read: lookup's when its match (found in them) is worth
        more than the queued plan (whose draft is paid), else the queued plan (chosen now when none was)."""
        lookup = self._lookup_plan(match, queued)
        if lookup is not None:
            return lookup
        if queued is not None:
            return queued
        return (self.before_read(False) if self.models else None) or PLAIN_STEP

    def _lookup_plan(self, match: Match | None, queued: Plan | None) -> Plan | None:
        if not self.lookup or match is None or not match.tokens:
            return None
        key = estimate_of("lookup", match)
        if self.fixed:
            T = self.sizes["lookup"][0]
            plan = Plan("lookup", T, key, _padded(match.tokens, T - 1))
            if self.costs is None or not self.models:
                return plan
            rate = self.estimate(key).expected()[T - 1] / self.costs.relative_step(T, "lookup")
            return plan if rate > self._rate(queued) else None
        fits = [T for T in self.sizes["lookup"] if T - 1 <= len(match.tokens)]
        if not fits:
            return None
        auto = self._auto(key, "lookup", fits)
        T, rate = auto.best()
        T = auto.book(T if rate > self._rate(queued) else 1)  # a try of the shortest size now and then
        return Plan("lookup", T, key, tuple(match.tokens[: T - 1])) if T > 1 else None

    def forced(self, plan: Plan, forced: list[int], sizes: list[int], estimate: str = GRAMMAR) -> Plan:
        """The step's plan once a grammar forces `forced` next: the grammar's own plan, which verifies them as
        drafts with no model run, where its acceptance estimate (`estimate`: GRAMMAR for the text in the tokens the
        answer wrote it in before, GRAMMAR_TEXT in the tokenizer's) makes it worth more per second than `plan`.
        The forced text is certain, its tokens are not: the target may write it in others. A model whose drafts
        are held to the grammar draws forced text itself, in the tokens it would write: the grammar's plan replaces
        it only where it is expected to land as many tokens too (`_tokens`). A fixed draft setting takes it for
        plain steps only."""
        fits = [T for T in sizes if 1 < T <= len(forced) + 1]
        if not fits:
            return plan
        grammars = [Plan(GRAMMAR, T, estimate, tuple(forced[: T - 1])) for T in fits]
        if self.fixed or self.costs is None:
            return grammars[-1] if plan.T == 1 else plan
        best = max(grammars, key=self._unpaid)
        faster = self._unpaid(best) > self._unpaid(plan)
        return best if faster and self._tokens(best) >= self._tokens(plan) else plan

    def _tokens(self, plan: Plan) -> float:
        """Expected tokens of a plan's step: a forced run that saves the model's draft yet lands fewer tokens than
        it would is not taken (it would spend the target's verifies for the drafter's time)."""
        return 1.0 if plan.T == 1 else self.estimate(plan.estimate).expected()[plan.drafts]

    def _unpaid(self, plan: Plan) -> float:
        """Expected tokens per second of a plan whose draft is still to pay."""
        assert self.costs is not None
        return self._tokens(plan) / self.costs.relative_step(plan.T, self._cost_kind(plan.method))

    def _rate(self, queued: Plan | None) -> float:
        """Expected tokens per second of the queued plan, its draft paid (None: the best a model offers now)."""
        assert self.costs is not None
        if queued is None:
            return max((rate for rate, _ in self._model_plans()), default=0.0)
        return self._tokens(queued) / self.costs.relative_verify(queued.T)


def _padded(tokens: list[int], k: int) -> tuple[int, ...]:
    """k drafts from a shorter proposal: its last token repeated (a fixed number of drafts per step)."""
    return tuple((tokens + tokens[-1:] * k)[:k])
