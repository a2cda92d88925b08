"""`auto`'s choice of drafts per step: expected tokens per second from per-position acceptance and step costs."""

from __future__ import annotations

import pytest

from dflash_chat.engine.draft_length import (
    PRIOR,
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


def test_costs_follow_the_step_timings():
    costs = Costs({1: 1.0, 16: 1.3}, draft=0.1)
    for _ in range(60):
        costs.observe("verify", 16, 2.6)
        costs.observe("draft", 0, 0.3)
    assert costs.step(16) == pytest.approx(2.9, rel=0.02)


def test_a_size_that_does_not_run_follows_the_machines_drift():
    """Drafting wins, so no plain step runs, while the machine slows to twice the warm-up's times: the plain
    step's figure moves with the others (a stale one could keep auto drafting for good); once plain steps
    run again their own timings set it."""
    costs = Costs({1: 1.0, 4: 1.6, 16: 2.0}, draft=0.3)
    for _ in range(80):
        costs.observe("verify", 16, 4.0)
        costs.observe("draft", 0, 0.6)
    assert costs.step(16) == pytest.approx(4.6, rel=0.02)
    assert 1.3 < costs.step(1) < 2.0 and 1.3 * 1.9 < costs.step(4) < 2.0 * 1.9
    for _ in range(80):
        costs.observe("verify", 1, 2.0)
    assert costs.step(1) == pytest.approx(2.0, rel=0.02) and costs.step(16) == pytest.approx(4.6, rel=0.15)
