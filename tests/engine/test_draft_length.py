"""`auto`'s choice of drafts per step: expected tokens per second from per-position acceptance and step costs."""

from __future__ import annotations

import pytest

from dflash_chat.engine.draft_length import (
    PRIOR,
    PROBE_FIRST,
    PROBE_MAX,
    Acceptance,
    AutoDraft,
    Costs,
    verify_sizes,
)

SIZES = verify_sizes("auto", 16)  # [1, 4, 8, 16]
GPU_LIKE = Costs({1: 1.0, 4: 1.05, 8: 1.1, 16: 1.3}, draft=0.15)  # a verify of 16 ~1.3x a plain step


def _estimate(rates: list[float], weight: float = 1e6) -> Acceptance:
    return Acceptance([weight] * len(rates), [r * weight for r in rates])


def test_expected_tokens_are_one_plus_the_running_products():
    a = _estimate([0.5, 0.5, 1.0] + [0.0] * 12)
    assert a.expected_tokens(0) == 1.0
    assert a.expected_tokens(3) == pytest.approx(1 + 0.5 + 0.25 + 0.25, abs=1e-4)
    assert a.expected_tokens(15) == pytest.approx(2.0, abs=1e-4)


def test_observe_counts_the_positions_up_to_the_first_rejection():
    a = Acceptance.fresh(15)
    assert a.rates() == [PRIOR] * 15  # nothing seen: the prior
    a.observe(drafted=7, accepted=2)  # drafts 1-2 accepted, 3 rejected, 4-7 never judged
    assert a.tries[:4] == [1.0, 1.0, 1.0, 0.0] and a.hits[:3] == [1.0, 1.0, 0.0]
    a.observe(drafted=3, accepted=3)  # all accepted: no position past the block was tried
    assert a.tries[3] == 0.0 and a.rates()[3] == PRIOR
    assert a.rates()[0] > a.rates()[2] > 0  # accepted twice vs once of twice, each with the prior


def test_a_fresh_conversation_drafts_and_a_few_rejections_turn_it_plain_on_a_slow_verify():
    cpu_like = Costs({1: 1.0, 4: 1.6, 8: 1.8, 16: 2.0}, draft=0.3)  # the demo pair on a CPU
    a = Acceptance.fresh(15)
    auto = AutoDraft(SIZES, a, cpu_like)
    drafted = []
    while (T := auto.choose()) > 1:
        drafted.append(T)
        a.observe(drafted=T - 1, accepted=0)
    assert 1 <= len(drafted) <= 5


def test_a_new_conversation_starts_from_the_recent_answers_held_loosely():
    recent = Acceptance.fresh(15)
    for _ in range(50):
        recent.observe(drafted=15, accepted=0)
    start = recent.start()
    assert max(start.tries) <= 3.0 and start.rates()[0] < 0.5  # doubtful, from what was seen
    for _ in range(5):
        start.observe(drafted=3, accepted=3)
    assert start.rates()[0] > 0.65  # and its own steps soon outweigh it


def test_high_acceptance_verifies_whole_blocks_and_none_decodes_plainly():
    assert AutoDraft(SIZES, _estimate([0.9] * 15), GPU_LIKE).choose() == 16
    assert AutoDraft(SIZES, _estimate([0.6] * 15), GPU_LIKE).choose() in (4, 8)
    assert AutoDraft(SIZES, _estimate([0.0] * 15), GPU_LIKE).choose() == 1
    # the same acceptance, but verifying costs far more than a plain step (a MoE target): shorter drafts win
    moe = Costs({1: 1.0, 4: 1.6, 8: 2.4, 16: 4.0}, draft=0.15)
    assert AutoDraft(SIZES, _estimate([0.7] * 15), moe).choose() == 4


def test_plain_runs_try_a_short_draft_less_often_each_time():
    auto = AutoDraft(SIZES, _estimate([0.0] * 15), GPU_LIKE)
    choices = [auto.choose() for _ in range(200)]
    tries = [i for i, T in enumerate(choices) if T > 1]
    assert all(choices[i] == 4 for i in tries)  # the shortest draft
    gaps = [b - a for a, b in zip([-1] + tries, tries)]
    assert gaps[:4] == [PROBE_FIRST, 2 * PROBE_FIRST, 4 * PROBE_FIRST, PROBE_MAX]
    assert len(tries) <= 200 // PROBE_MAX + 3  # a few percent of the steps


def test_costs_follow_the_step_timings():
    costs = Costs({1: 1.0, 16: 1.3}, draft=0.1)
    for _ in range(60):
        costs.observe("verify", 16, 2.6)
        costs.observe("draft", 0, 0.3)
    assert costs.step(16) == pytest.approx(2.9, rel=0.02) and costs.step(1) == 1.0
