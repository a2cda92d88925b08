"""The draft figures in the three shapes servers report them, read back; and stop strings on a stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_chat.engine.events import GenerationStats
from dflash_chat.runtime import openai_protocol as op
from dflash_chat.runtime.stops import StopStrings

RECORDED = (Path(__file__).parents[1] / "serve" / "data" / "vllm_metrics.prom").read_text()
STATS = GenerationStats(
    prompt_tokens=30,
    reused_tokens=10,
    new_tokens=24,
    steps=6,
    drafted=90,
    accepted=19,
    acceptance_histogram=[1, 0, 2, 0, 0, 3] + [0] * 10,
    prefill_s=0.02,
    decode_s=0.1,
    draft_histogram=[0] * 15 + [6],
    draft="auto",
    speculative=True,
)


def test_per_request_metrics_carry_vllms_fields_and_read_back():
    spec = op.speculative_decoding(STATS, spec_tokens=15)
    assert (spec["num_spec_steps"], spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]) == (6, 90, 19)
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 19 / 6)
    assert spec["draft_acceptance_rate"] == pytest.approx(19 / 90)
    # per position: the steps that accepted more than i drafts; they add up to the accepted drafts
    assert spec["num_accepted_tokens_per_pos"][:6] == [5, 5, 3, 3, 3, 0]
    assert sum(spec["num_accepted_tokens_per_pos"]) == 19 and len(spec["num_accepted_tokens_per_pos"]) == 15
    assert (spec["draft"], spec["mean_draft_length"], spec["num_drafts"]) == ("auto", 15.0, 6)
    back = op.from_metrics({"metrics": {"speculative_decoding": spec}})
    assert back == op.Acceptance(6, 90, 19, tuple(STATS.acceptance_histogram), op.PER_REQUEST, "auto")


def test_steps_that_drafted_nothing_are_no_drafts():
    """`auto` takes plain steps where drafting does not pay: vLLM's drafts count only the others."""
    from dataclasses import replace

    stats = replace(STATS, new_tokens=26, steps=8, draft_histogram=[2] + [0] * 14 + [6])
    spec = op.speculative_decoding(stats, spec_tokens=15)
    assert (spec["num_spec_steps"], spec["num_drafts"], spec["mean_draft_length"]) == (8, 6, 90 / 8)


def test_vllms_sparse_histogram_and_broken_objects():
    sparse = {
        "num_spec_steps": 43,
        "num_draft_tokens": 129,
        "num_accepted_draft_tokens": 10,
        "acceptance_histogram": {"0": 39, "1": 1, "3": 3},
    }
    assert op.from_metrics({"metrics": {"speculative_decoding": sparse}}).histogram == (39, 1, 0, 3)
    assert op.from_metrics({"metrics": {"speculative_decoding": {"num_draft_tokens": "many"}}}) is None
    assert op.from_metrics({"metrics": None}) is None and op.from_metrics({}) is None


def test_llama_cpp_timings_both_ways():
    timings = op.llama_timings(STATS)
    assert (timings["draft_n"], timings["draft_n_accepted"], timings["predicted_n"]) == (90, 19, 24)
    assert timings["cache_n"] == 10 and timings["prompt_n"] == 20
    assert op.from_timings({"timings": timings}) == op.Acceptance(24 - 1 - 19, 90, 19, (), op.TIMINGS)
    assert op.from_timings({"timings": {"predicted_n": 5}}) is None  # no drafting: no draft fields


def test_vllm_counters_from_a_recorded_metrics_text_and_their_growth():
    before = op.read_counters(RECORDED)
    assert before[op.DRAFTS] == 3412 and before[op.DRAFT_TOKENS] == 51180
    assert before[f"{op.ACCEPTED_PER_POS}[0]"] == 2931 and before[f"{op.ACCEPTED_PER_POS}[14]"] == 308
    grown = dict(before)
    grown[op.DRAFTS] += 4
    grown[op.DRAFT_TOKENS] += 60
    grown[op.ACCEPTED_TOKENS] += 7
    for position, count in enumerate([3, 2, 1, 1]):
        grown[f"{op.ACCEPTED_PER_POS}[{position}]"] += count
    found = op.from_counters(before, grown)
    assert (found.steps, found.drafted, found.accepted, found.source) == (4, 60, 7, op.COUNTERS)
    assert found.histogram[:5] == (1, 1, 1, 0, 1) and sum(found.histogram) == 4
    assert op.from_counters(before, before) is None  # nothing drafted meanwhile
    assert op.read_counters("vllm:num_requests_running 0\n") is None  # a vLLM that does not draft
    assert op.read_counters("<html>not prometheus</html>") is None


@pytest.mark.parametrize(
    "pieces, stops, text, matched",
    [
        (["Hello wor", "ld. Bye"], ["world"], "Hello ", True),
        (["ab", "c", "d"], ["cd"], "ab", True),
        (["abc"], ["x"], "abc", False),
        (["a<", "|end"], ["<|end|>"], "a<|end", False),  # a start that never completed is given back
        (["one two"], ["two", "one"], "", True),  # the first stop string in the text wins
    ],
)
def test_stop_strings_cut_before_the_first_one_and_hold_back_partial_ones(pieces, stops, text, matched):
    stop = StopStrings(stops)
    out = "".join(stop.feed(p) for p in pieces) + stop.flush()
    assert (out, stop.matched) == (text, matched)
    assert stop.feed("more") == ("" if matched else "more")  # nothing after a match, ever
