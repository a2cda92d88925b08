"""Which method drafts each step and how far (engine/speculation.py): the settings' sizes, and `auto`'s choice by
expected tokens per second from each method's acceptance estimate and the step costs."""

from __future__ import annotations

import pytest

from dflash_chat.engine import rules
from dflash_chat.engine.draft_length import PROBE_FIRST, Acceptance, Costs
from dflash_chat.engine.errors import MissingMethod
from dflash_chat.engine.lookup import Match
from dflash_chat.engine.speculation import (
    LONG_MATCH,
    PLAIN_STEP,
    Chooser,
    Plan,
    available,
    method_sizes,
    parse_speculate,
    takes_plain_steps,
    width,
)

MOST = available(16, mtp=True)  # a DFlash drafter of block 16, an MTP layer, lookup
# a GPU-like machine: a verify of 16 ~1.3x a plain step, an MTP draft of one token ~6% of one
COSTS = Costs(
    {1: 1.0, 2: 1.02, 3: 1.03, 4: 1.05, 8: 1.1, 16: 1.3},
    {
        "dflash": {4: 0.15, 8: 0.15, 16: 0.15},
        "mtp": {2: 0.06, 3: 0.12, 4: 0.18},
        "lookup": {2: 0.01, 4: 0.01, 8: 0.01, 16: 0.01},
    },
)


def _estimate(rate: float, positions: int = 15, weight: float = 1e6) -> Acceptance:
    return Acceptance([weight] * positions, [rate * weight] * positions)


def _chooser(rates: dict[str, float], draft="auto") -> Chooser:
    estimates = {key: _estimate(rate) for key, rate in rates.items()}
    sizes = method_sizes("auto", draft, MOST)
    return Chooser(sizes, takes_plain_steps(draft, sizes), COSTS, estimates.__getitem__, fixed=draft != "auto")


ALL = {"dflash": 0.5, "mtp": 0.5, "lookup": 0.5, "lookup-long": 0.95}


def test_the_settings_give_each_method_its_sizes():
    assert method_sizes("auto", "auto", MOST) == {
        "dflash": [4, 8, 16],
        "mtp": [2, 3, 4],
        "lookup": [2, 4, 8, 16],
    }
    assert method_sizes("mtp", 12, MOST) == {"mtp": [8]}  # a fixed number, capped at what the method drafts
    assert method_sizes("auto", "off", MOST) == method_sizes("none", "auto", MOST) == {}
    assert takes_plain_steps(5, {"dflash": [6]}) is False and takes_plain_steps(5, {"lookup": [6]}) is True
    assert width("auto", MOST) == 16 and width("none", MOST) == 1
    assert available(8, mtp=True) == {"dflash": 7, "mtp": 7, "lookup": 7}  # no wider than the drafter's block
    assert available(None, mtp=False) == {"lookup": 15}


def test_the_speculate_setting_is_checked_and_a_missing_method_is_said():
    assert [parse_speculate(v) for v in ("AUTO", " mtp ", "none")] == ["auto", "mtp", "none"]
    with pytest.raises(rules.Invalid, match="speculate must be auto, dflash, mtp, lookup or none, got 'eagle'"):
        parse_speculate("eagle")
    with pytest.raises(MissingMethod, match="speculate mtp needs the target's own MTP layer"):
        parse_speculate("mtp", available(16, mtp=False))
    with pytest.raises(MissingMethod, match="speculate dflash needs a DFlash drafter"):
        parse_speculate("dflash", available(None, mtp=True))


def test_plain_steps_when_nothing_pays():
    chooser = _chooser({"dflash": 0.02, "mtp": 0.02, "lookup": 0.02, "lookup-long": 0.02})
    assert chooser.before_read(False) == PLAIN_STEP
    assert chooser.after_read(PLAIN_STEP, None) == PLAIN_STEP


def test_the_method_with_the_most_tokens_per_second_drafts_at_its_best_depth():
    """DFlash's drafts land rarely here and the MTP layer's often: MTP drafts, as deep as pays; the other way
    round DFlash drafts its longest block."""
    mtp = _chooser({**ALL, "dflash": 0.1, "mtp": 0.9}).before_read(False)
    assert mtp.method == "mtp" and mtp.T == 4
    dflash = _chooser({**ALL, "dflash": 0.95, "mtp": 0.6}).before_read(False)
    assert dflash == Plan("dflash", 16, "dflash")


def test_a_long_fresh_lookup_match_pre_empts_a_queued_model_draft():
    chooser = _chooser({**ALL, "dflash": 0.7})
    queued = chooser.before_read(False)
    assert queued.method == "dflash"
    long = Match(list(range(20)), LONG_MATCH)
    plan = chooser.after_read(queued, long)
    assert plan.method == "lookup" and plan.estimate == "lookup-long" and plan.tokens == tuple(range(15))
    short = Match(list(range(20)), 2)  # a short match lands half as often: the queued draft stays
    assert chooser.after_read(queued, short) is queued


def test_while_lookup_drafts_the_next_step_waits_for_the_read():
    chooser = _chooser({**ALL, "dflash": 0.7})
    assert chooser.before_read(lookup_drafting=True) is None
    assert chooser.after_read(None, Match([5, 6, 7], LONG_MATCH)).method == "lookup"  # up to 3 tokens: T = 4
    assert chooser.after_read(None, None).method == "dflash"  # the copy ended: a model drafts after the read


def test_a_method_that_loses_is_tried_now_and_then():
    chooser = _chooser({**ALL, "dflash": 0.9, "mtp": 0.3})
    plans = [chooser.before_read(False) for _ in range(PROBE_FIRST)]
    assert [p.method for p in plans[:-1]] == ["dflash"] * (PROBE_FIRST - 1)
    assert plans[-1] == Plan("mtp", 2, "mtp")  # its shortest size, once
    assert chooser.before_read(False).method == "dflash"


def test_a_fixed_draft_setting_drafts_every_method_at_its_size():
    chooser = _chooser(ALL, draft=3)
    assert chooser.before_read(False).T == 4
    padded = chooser.after_read(PLAIN_STEP, Match([9], LONG_MATCH))  # a short proposal is padded to 3
    assert padded.tokens == (9, 9, 9)


def test_a_grammars_forced_tokens_are_a_plan_of_their_own_weighed_by_their_estimate():
    """The tokens a grammar forces (engine/structured.py) are verified as drafts with no model run where their own
    estimate (the target may write their text in other tokens) makes that worth more than the step's plan."""
    sizes = [1, 2, 3, 4, 8, 16]
    sure = _chooser({"dflash": 0.9, "mtp": 0.9, "lookup": 0.5, "grammar": 0.95})
    assert sure.forced(PLAIN_STEP, [5, 6], sizes) == Plan("grammar", 3, "grammar", (5, 6))
    assert sure.forced(Plan("mtp", 2, "mtp"), [5, 6, 7], sizes) == Plan("grammar", 4, "grammar", (5, 6, 7))
    assert sure.forced(Plan("dflash", 16, "dflash"), [5, 6], sizes).method == "dflash"  # 15 good drafts beat 2
    missed = _chooser({"dflash": 0.9, "mtp": 0.9, "lookup": 0.5, "grammar": 0.0})
    assert missed.forced(PLAIN_STEP, [5, 6, 7], sizes) == PLAIN_STEP
    fixed = _chooser({"dflash": 0.9, "mtp": 0.9, "lookup": 0.5, "grammar": 0.0}, draft=15)
    assert fixed.forced(PLAIN_STEP, [5, 6, 7], [1, 4, 16]).method == "grammar"  # a fixed setting: plain steps only
    assert fixed.forced(Plan("dflash", 16, "dflash"), [5, 6, 7], [1, 4, 16]).method == "dflash"


def test_forced_tokens_in_the_tokenizers_spelling_are_weighed_by_their_own_estimate():
    """Forced text in the tokenizer's tokens (not yet in the answer's own) is a plan of the grammar-text estimate:
    a target that writes such text in other tokens lowers that one, not the estimate of text it wrote before."""
    sizes = [1, 2, 3, 4, 8, 16]
    chooser = _chooser({"dflash": 0.9, "mtp": 0.9, "lookup": 0.5, "grammar": 0.95, "grammar-text": 0.0})
    assert chooser.forced(PLAIN_STEP, [5, 6], sizes) == Plan("grammar", 3, "grammar", (5, 6))
    assert chooser.forced(PLAIN_STEP, [5, 6], sizes, "grammar-text") == PLAIN_STEP


def test_a_forced_run_that_lands_fewer_tokens_than_the_models_draft_does_not_replace_it():
    """A grammar's plan costs no draft, so it can be worth more per second while landing fewer tokens than the
    model's plan (whose draft, held to the grammar, writes the forced text too): it replaces it only when it is
    expected to land as many."""
    sizes = [1, 2, 3, 4, 8, 16]
    chooser = _chooser({"dflash": 0.6, "mtp": 0.6, "lookup": 0.5, "grammar": 0.95})
    dflash = Plan("dflash", 16, "dflash")  # 2.5 tokens expected
    one = Plan("grammar", 2, "grammar", (5,))  # 1.95 tokens expected, at a verify of 2
    assert chooser._unpaid(one) > chooser._unpaid(dflash)  # faster per second, yet not taken
    assert chooser.forced(dflash, [5], sizes) == dflash
    assert chooser.forced(dflash, [5, 6], sizes) == Plan("grammar", 3, "grammar", (5, 6))  # 2.85 tokens
