"""`auto`'s choice of drafts per step: expected tokens per second from per-position acceptance and step costs."""

from __future__ import annotations

import pytest

from dflash_chat.engine.draft_length import (
    HELD,
    PRIOR_GREEDY,
    PRIOR_SAMPLED,
    PROBE_FIRST,
    TAIL_BLEND,
    Acceptance,
    AutoDraft,
    Costs,
    Record,
    verify_sizes,
)

SIZES = verify_sizes("auto", 16)  # [1, 4, 8, 16]
GPU_LIKE = Costs(
    {1: 1.0, 4: 1.05, 8: 1.1, 16: 1.3}, {"dflash": {4: 0.15, 8: 0.15, 16: 0.15}}
)  # a verify of 16 ~1.3x a plain step


def _estimate(rates: list[float], weight: float = 1e6) -> Acceptance:
    return Acceptance([weight] * len(rates), [r * weight for r in rates])


def test_expected_tokens_are_one_plus_the_running_products():
    a = _estimate([0.5, 0.5, 1.0] + [0.0] * 12)
    assert a.expected_tokens(0) == 1.0
    assert a.expected_tokens(3) == pytest.approx(1 + 0.5 + 0.25 + 0.25, abs=1e-4)
    assert a.expected_tokens(15) == pytest.approx(2.0, abs=1e-4)


def test_observe_counts_the_positions_up_to_the_first_rejection():
    a = Record.of(greedy=False).fresh(15)
    assert a.rates() == [PRIOR_SAMPLED] * 15  # nothing seen: the prior
    a.observe(drafted=7, accepted=2)  # drafts 1-2 accepted, 3 rejected, 4-7 never judged
    assert a.tries[:4] == [1.0, 1.0, 1.0, 0.0] and a.hits[:3] == [1.0, 1.0, 0.0]
    a.observe(drafted=3, accepted=3)  # all accepted: no position past the block was tried
    rates = a.rates()
    assert rates[2] < PRIOR_SAMPLED and a.tries[3] == 0.0
    assert rates[3] == pytest.approx(PRIOR_SAMPLED + TAIL_BLEND * (rates[2] - PRIOR_SAMPLED))  # leans down toward it
    assert rates[0] > rates[2] > 0  # accepted twice vs once of twice, each with the prior


def test_fully_accepted_short_drafts_make_the_longer_ones_look_as_good():
    """Every draft of a short verify accepted: the positions past it, which no step reached, are taken to
    do as well as the last one reached, so auto grows the draft even where its warm-up overrated the cost
    of the longest verify (a size that never runs never has that figure refreshed)."""
    a = Record.of(greedy=False).fresh(15)
    for _ in range(10):
        a.observe(drafted=7, accepted=7)
    rates = a.rates()
    assert rates[6] > PRIOR_SAMPLED and rates[7] == pytest.approx(
        PRIOR_SAMPLED + a.tries[6] / (a.tries[6] + 2) * (rates[6] - PRIOR_SAMPLED)
    )
    assert all(PRIOR_SAMPLED < later < rates[6] for later in rates[7:])  # leaning up, back to PRIOR_SAMPLED far away
    overrated = Costs({1: 1.0, 4: 1.7, 8: 1.9, 16: 3.0}, {"dflash": {4: 0.45, 8: 0.45, 16: 0.7}})
    assert AutoDraft(SIZES, a, overrated).choose() == 16


def test_early_rejections_lower_the_later_positions_that_were_never_reached():
    """Drafts rejected at the first position say little directly about the tenth, but a fixed optimistic
    prior there kept long drafts going through a run of rejections: untried positions lean on the one
    before them, and drift back to the prior far from the last one tried."""
    a = Record.of(greedy=False).fresh(15)
    for _ in range(3):
        a.observe(drafted=15, accepted=0)
    rates = a.rates()
    assert rates[0] < rates[1] < rates[2] < PRIOR_SAMPLED  # the nearest untried positions follow the rejected one
    assert rates[14] == pytest.approx(PRIOR_SAMPLED, abs=0.01)  # the far ones keep the prior
    fixed_prior = 1 + rates[0] * sum(PRIOR_SAMPLED**k for k in range(15))  # untried positions all at PRIOR_SAMPLED
    assert a.expected_tokens(15) < 1 + 0.8 * (fixed_prior - 1)


def test_a_fresh_conversation_drafts_and_a_few_rejections_turn_it_plain_on_a_slow_verify():
    cpu_like = Costs(
        {1: 1.0, 4: 1.6, 8: 1.8, 16: 2.0}, {"dflash": {4: 0.2, 8: 0.25, 16: 0.3}}
    )  # the demo pair on a CPU
    a = Record.of(greedy=False).fresh(15)
    auto = AutoDraft(SIZES, a, cpu_like)
    drafted = []
    while (T := auto.choose()) > 1:
        drafted.append(T)
        a.observe(drafted=T - 1, accepted=0)
    assert 1 <= len(drafted) <= 5


def test_costs_follow_the_step_timings():
    costs = Costs({1: 1.0, 16: 1.3}, {"dflash": {16: 0.1}})
    for _ in range(60):
        costs.observe("verify", 16, 2.6)
        costs.observe("dflash", 16, 0.3)
    assert costs.step(16) == pytest.approx(2.9, rel=0.02)


def test_timings_taken_at_once_move_the_costs_as_taken_one_by_one():
    """The loop hands the costs a few steps' timings at once (Costs.observe_all): the figures come out as they
    would one timing at a time, and the tables auto reads are made again from them."""
    timings = [("verify", 16, 2.6), ("dflash", 16, 0.3), ("verify", 1, 1.4), ("verify", 16, 2.2), ("dflash", 4, 0.2)]
    one_by_one, at_once = (Costs({1: 1.0, 4: 1.2, 16: 2.0}, {"dflash": {4: 0.2, 16: 0.25}}) for _ in range(2))
    before = at_once.relative((1, 4, 16))
    for timing in timings:
        one_by_one.observe(*timing)
    at_once.observe_all(timings)
    assert at_once.own == one_by_one.own and at_once.drift == one_by_one.drift and at_once.seen == one_by_one.seen
    assert at_once.relative((1, 4, 16)) == one_by_one.relative((1, 4, 16)) != before


def test_each_verify_size_has_its_own_draft_cost():
    """A draft for a short verify computes fewer rows (on the CPU the LM head's rows are much of its cost):
    a size's step counts its own draft."""
    costs = Costs({1: 1.0, 4: 1.2, 16: 1.5}, {"dflash": {4: 0.1, 16: 0.4}})
    assert costs.step(1) == pytest.approx(1.0) and costs.step(4) == pytest.approx(1.3)
    assert costs.step(16) == pytest.approx(1.9)
    for _ in range(100):  # the verify as measured, its draft twice as long
        costs.observe("dflash", 4, 0.2)
        costs.observe("verify", 4, 1.2)
    assert costs.step(4) == pytest.approx(1.4, rel=0.05)


def test_a_longer_step_never_costs_less_than_a_shorter_one():
    """A warm-up that a busy moment hit (seen on the CPU: the 8-token verify measured below the 4-token one)
    must not make a middle size look cheap: a fresh conversation then started at 8 drafts on prompts whose
    steps accept all 15."""
    skewed = Costs(
        {1: 10.45, 4: 21.94, 8: 17.87, 16: 23.29}, {"dflash": {4: 5.43, 8: 4.26, 16: 5.14}}
    )  # ms, as measured
    assert skewed.step(8) == pytest.approx(skewed.step(4)) == pytest.approx(21.94 + 5.43)
    assert skewed.step(16) == pytest.approx(23.29 + 5.14)
    assert AutoDraft(SIZES, Record.of(greedy=False).fresh(15), skewed).choose() == 16


def test_a_step_that_accepts_every_draft_grows_the_next_one():
    """A fresh conversation on a warm-up that overrated the 16-token verify starts at 8; its drafts all land,
    which says nothing of the positions past them: the next step tries 16 (and measures its cost in the
    loop), where the estimate alone would stay at 8 for several steps."""
    a = Record.of(greedy=False).fresh(15)
    overrated = Costs({1: 1.0, 4: 1.6, 8: 1.8, 16: 3.5}, {"dflash": {4: 0.4, 8: 0.4, 16: 0.8}})
    auto = AutoDraft(SIZES, a, overrated)
    assert auto.choose() == 8
    a.observe(drafted=7, accepted=7)
    rate = {T: a.expected_tokens(T - 1) / overrated.step(T) for T in SIZES}
    assert max(rate, key=rate.__getitem__) == 8  # the estimate alone would stay
    assert auto.choose() == 16
    a.observe(drafted=15, accepted=3)  # a partial accept grows nothing: the estimate chooses
    rate = {T: a.expected_tokens(T - 1) / overrated.step(T) for T in SIZES}
    assert auto.choose() == max(rate, key=rate.__getitem__)


def test_a_lucky_try_while_plain_steps_win_grows_nothing():
    """A conversation the drafter does not know: plain steps win, and the try of a short draft now and then
    lands whole by luck (at T > 0 that happens): the estimate, not the growth rule, chooses next."""
    a = Record.of(greedy=False).fresh(15)
    cpu_like = Costs({1: 1.0, 4: 1.7, 8: 1.8, 16: 2.1}, {"dflash": {4: 0.45, 8: 0.45, 16: 0.5}})
    auto = AutoDraft(SIZES, a, cpu_like)
    for _ in range(6):
        a.observe(drafted=15, accepted=0)
    sizes = [auto.choose() for _ in range(PROBE_FIRST)]
    assert sizes[:-1] == [1] * (PROBE_FIRST - 1) and sizes[-1] == 4  # plain, then a try
    a.observe(drafted=3, accepted=3)
    assert auto.choose() == 1


def test_the_first_loop_timings_of_a_size_correct_a_skewed_warm_up_within_a_few_steps():
    """A warm-up that a busy moment skewed (the 16-token verify measured 1.5x what it costs in the loop):
    a handful of that size's steps bring its figure most of the way back, not the ~20 an EMA would need."""
    costs = Costs({1: 1.0, 8: 1.6, 16: 2.7}, {"dflash": {8: 0.3, 16: 0.3}})
    for _ in range(5):
        costs.observe("verify", 1, 1.0)
        costs.observe("verify", 16, 1.8)
        costs.observe("dflash", 16, 0.3)
    assert costs.step(16) < 2.1 * 1.15  # its true cost is 2.1


def test_one_stretched_timing_barely_moves_the_costs():
    """A busy moment on the machine (one step 20x its usual time) counts as at most twice its figure: auto
    does not turn to plain decoding (or to drafting) on one outlier, while a lasting change is followed."""
    costs = Costs({1: 1.0, 16: 2.0}, {"dflash": {16: 0.5}})
    costs.observe("verify", 16, 40.0)
    assert costs.step(16) < 2.5 * 1.3
    for _ in range(60):
        costs.observe("verify", 16, 6.0)
        costs.observe("dflash", 16, 1.5)
    assert costs.step(16) == pytest.approx(7.5, rel=0.05)


def test_a_size_that_does_not_run_follows_the_machines_drift():
    """Drafting wins, so no plain step runs, while the machine slows to twice the warm-up's times: the plain
    step's figure moves with the others (a stale one could keep auto drafting for good); once plain steps
    run again their own timings set it."""
    costs = Costs({1: 1.0, 4: 1.6, 16: 2.0}, {"dflash": {4: 0.3, 16: 0.3}})
    for _ in range(80):
        costs.observe("verify", 16, 4.0)
        costs.observe("dflash", 16, 0.6)
    assert costs.step(16) == pytest.approx(4.6, rel=0.02)
    assert 1.3 < costs.step(1) < 2.0 and 1.3 * 1.9 < costs.step(4) < 2.0 * 1.9
    for _ in range(80):
        costs.observe("verify", 1, 2.0)
    assert costs.step(1) == pytest.approx(2.0, rel=0.02) and costs.step(16) == pytest.approx(4.6, rel=0.15)


def test_a_fresh_greedy_answer_drafts_the_longest_block_where_the_demo_pairs_accept_it():
    """Greedy drafts land far more often than sampled ones (the demo pair, per position: 0.93-0.99 greedy on
    code questions, 0.54-0.69 at T 0.7): each decoding starts from its own prior. With one prior of 0.8 and the
    demo pair's step costs on this CPU (the 16-token step 1.18x the 8-token one), a greedy answer's first two
    steps drafted 7 where all 15 land."""
    demo_cpu = Costs({1: 9.68, 4: 15.0, 8: 15.55, 16: 18.36}, {"dflash": {4: 3.8, 8: 3.8, 16: 4.5}})  # ms, as measured
    greedy, sampled = Record.of(greedy=True).fresh(15), Record.of(greedy=False).fresh(15)
    assert greedy.rates() == [PRIOR_GREEDY] * 15 and sampled.rates() == [PRIOR_SAMPLED] * 15
    assert AutoDraft(SIZES, greedy, demo_cpu).choose() == 16
    assert AutoDraft(SIZES, Record.of(greedy=True).fresh(15), demo_cpu).choose() == 16
    one_prior = Acceptance([0.0] * 15, [0.0] * 15, prior=0.8)
    assert AutoDraft(SIZES, one_prior, demo_cpu).choose() == 8
    assert AutoDraft(SIZES, sampled, demo_cpu).choose() < 16  # long drafts at T > 0 wait for evidence


DEMO_CPU = Costs({1: 9.68, 4: 15.0, 8: 15.55, 16: 18.36}, {"dflash": {4: 3.8, 8: 3.8, 16: 4.5}})  # ms, as measured


def _histogram(steps: int, landed: int) -> list[int]:
    """A stats histogram of `steps` drafting steps, `landed` of which accepted their first draft (and no more)."""
    return [steps - landed, landed] + [0] * 14


def test_a_drafter_that_lands_nothing_starts_new_conversations_plain():
    """The first DFlash demo drafter on raw code: every new chat paid two long drafts and a few short ones
    before auto turned plain (0.87x plain decoding). After three answers whose first drafts never landed, a
    new conversation's first step is plain, and its first try of a short draft comes PROBE_FIRST steps in,
    however far apart the last answers' tries were: new text may be the drafter's (after raw code it missed,
    the DFlash2 demo drafter's prose questions waited 32 plain steps for a try and ran at 0.78x its fixed
    drafts)."""
    record = Record.of(greedy=True)
    assert record.prior() == PRIOR_GREEDY and AutoDraft(SIZES, record.fresh(15), DEMO_CPU).choose() == 16
    for _ in range(3):
        record.learn(_histogram(20, 0))
    fresh = record.fresh(15)
    assert fresh.prior == pytest.approx(PRIOR_GREEDY / (1 + 1 + 0.7 + 0.49)) and fresh.probe_every == PROBE_FIRST
    auto = AutoDraft(SIZES, fresh, DEMO_CPU)
    assert [auto.choose() for _ in range(PROBE_FIRST)] == [1] * (PROBE_FIRST - 1) + [SIZES[1]]  # a try
    auto.acceptance.observe(SIZES[1] - 1, 0)  # that lands nothing: the next waits twice as long
    assert [auto.choose() for _ in range(2 * PROBE_FIRST)] == [1] * (2 * PROBE_FIRST - 1) + [SIZES[1]]


def test_a_drafter_that_lands_keeps_new_conversations_drafting_and_the_newest_answers_weigh_most():
    record, earlier = Record.of(greedy=False), Record.of(greedy=False)
    earlier.learn(_histogram(10, 10))  # the same four answers, the good one first
    for _ in range(3):
        record.learn(_histogram(10, 0))
        earlier.learn(_histogram(10, 0))
    low = record.prior()
    record.learn(_histogram(10, 10))  # a good answer
    assert low < earlier.prior() < PRIOR_SAMPLED and record.prior() > low + 0.25 and record.prior() > earlier.prior()
    for _ in range(6):
        record.learn(_histogram(10, 10))
    assert record.prior() > PRIOR_SAMPLED + 0.15 and AutoDraft(SIZES, record.fresh(15), DEMO_CPU).choose() == 16


def test_answers_that_did_not_draft_teach_the_record_nothing():
    record = Record.of(greedy=False)
    record.learn(_histogram(0, 0))  # plain steps only: no first draft to count
    assert record.prior() == PRIOR_SAMPLED and record.answers == 0
    record.learn(_histogram(10, 0))
    assert record.prior() < PRIOR_SAMPLED and record.answers == 1


def test_a_held_draft_has_a_figure_of_its_own_that_leaves_the_methods_and_the_drift():
    """A draft held to a grammar (read row by row on the host) starts from its method's figure and learns its own
    from the loop's timings; the method's unheld figure and the machine's drift are not moved by it."""
    costs = Costs({1: 1.0, 16: 1.3}, {"dflash": {16: 0.2}})
    assert costs.step(16, "dflash" + HELD) == pytest.approx(1.5)
    for _ in range(40):
        costs.observe("dflash" + HELD, 16, 0.6)
    assert costs.drift == 1.0 and costs.step(16, "dflash") == pytest.approx(1.5)
    assert costs.step(16, "dflash" + HELD) == pytest.approx(1.9, abs=0.01)


def test_what_auto_reads_each_step_is_kept_until_a_step_teaches_it():
    """Acceptance.expected and Costs.relative are computed once and kept until an observation changes them (auto
    reads them several times a step): what they give is always what a fresh computation of the same counts gives."""
    import random

    rng = random.Random(5)
    a = Acceptance([0.0] * 15, [0.0] * 15, PRIOR_GREEDY)
    costs = Costs(
        {1: 1.0, 2: 1.02, 4: 1.05, 8: 1.1, 16: 1.3}, {"dflash": {4: 0.15, 8: 0.15, 16: 0.15}, "mtp": {2: 0.1}}
    )
    for _ in range(40):
        first = a.expected()
        assert a.expected() is first  # kept
        drafted = rng.choice([3, 7, 15])
        a.observe(drafted, rng.randrange(drafted + 1))
        fresh = Acceptance(list(a.tries), list(a.hits), a.prior)
        assert a.expected() == fresh.expected() and a.expected() is not first
        tables = (("dflash", (1, 4, 8, 16)), ("mtp", (1, 2)), ("lookup", (1, 2, 4)))
        kept = {}
        for method, sizes in tables:
            kept[method] = costs.relative(sizes, method)
            assert costs.relative(sizes, method) is kept[method]
        kind, T = rng.choice([("verify", 1), ("verify", 4), ("verify", 16), ("dflash", 8), ("mtp", 2)])
        costs.observe(kind, T, rng.uniform(0.05, 2.0))
        for method, sizes in tables:  # a table is made again only when the timing's figure is in it
            reads = T in sizes and kind in ("verify", method)
            assert (costs.relative(sizes, method) is kept[method]) is not reads
        again = Costs(costs.verify, costs.draft, costs.drift, dict(costs.own), dict(costs.seen))
        for method, sizes in (("dflash", (1, 4, 8, 16)), ("mtp", (1, 2)), ("lookup", (1, 2, 4))):
            assert costs.relative(sizes, method) == again.relative(sizes, method)
            assert costs.steps(sizes, method) == again.steps(sizes, method)
            assert costs.step(sizes[-1], method) == again.step(sizes[-1], method)
