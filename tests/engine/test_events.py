"""The event stream and its statistics; cancellation and length limits."""

import threading

import pytest
import torch

from dflash_chat.bench.oracle import OracleDrafter
from dflash_chat.engine.events import Finished, Prefilled, Step
from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.helpers import run


def test_event_order_and_statistics_add_up(tiny_dirs):
    target_dir, drafter_dir, _ = tiny_dirs["qwen3_5"]
    target = load_target(target_dir, "cpu", torch.float32)
    engine = Engine(target, load_drafter(drafter_dir, target), max_context=256, draft=15)
    tokens, finished, events = run(engine, [4, 5, 6, 7], SamplingParams(max_new_tokens=50))
    assert isinstance(events[0], Prefilled) and events[0].prompt_tokens == 4
    assert all(isinstance(e, Step) for e in events[1:-1]) and events[-1] is finished
    assert finished.reason == "length"
    s = finished.stats
    steps = events[2:-1]
    assert len(tokens) == s.new_tokens == 50
    assert s.steps == len(steps) == sum(s.draft_histogram)
    assert sum(s.acceptance_histogram) == s.steps - s.draft_histogram[0]  # steps that verified drafts
    assert s.draft == "15" and s.draft_histogram[0] == 1  # only the last step, with one token left, drafts nothing
    assert all(
        e.drafted == min(15, 50 - sum(len(x.token_ids) for x in events[1:i]) - 1) for i, e in enumerate(steps, 2)
    )
    assert s.mean_draft_length == s.drafted / s.steps
    assert s.drafted == sum(e.drafted for e in steps) and s.accepted == sum(e.accepted for e in steps)
    assert s.acceptance_rate == s.accepted / s.drafted
    assert s.mean_acceptance_length == (s.new_tokens - 1) / s.steps
    assert all(len(e.token_ids) == e.accepted + 1 for e in steps)
    assert s.ttft_s > 0 and s.decode_s > 0 and s.decode_tokens_per_s > 0 and s.peak_memory_bytes > 0
    # drafting and verifying are parts of the decode, each counted once
    assert 0 < s.draft_s and 0 < s.verify_s and s.draft_s + s.verify_s <= s.decode_s
    record = s.as_dict()
    assert record["new_tokens"] == 50 and record["speculative"] is True


def test_cancel_ends_the_answer_and_keeps_what_was_produced(tiny_dirs):
    target = load_target(tiny_dirs["qwen3_5"][0], "cpu", torch.float32)
    engine = Engine(target, None, max_context=256)
    cancel = threading.Event()
    produced = []
    finished = None
    for event in engine.generate([1, 2, 3], SamplingParams(max_new_tokens=100), cancel):
        if isinstance(event, Step):
            produced.extend(event.token_ids)
            if len(produced) == 5:
                cancel.set()
        elif isinstance(event, Finished):
            finished = event
    assert finished.reason == "cancelled"
    assert finished.stats.new_tokens == len(produced) == 5
    stats = finished.stats
    assert stats.draft_s == 0 and 0 < stats.verify_s <= stats.decode_s  # no drafter: every step is a target forward
    # the state stays usable: continuing the conversation reuses it
    _, _, events = run(engine, [1, 2, 3] + produced + [9], SamplingParams(max_new_tokens=3))
    assert events[0].reused_tokens == 3 + 4


def test_speculative_steps_never_exceed_max_new_tokens(tiny_dirs):
    target = load_target(tiny_dirs["qwen3"][0], "cpu", torch.float32)
    ar = Engine(target, None, max_context=256)
    reference, _, _ = run(ar, [8, 9], SamplingParams(max_new_tokens=40))
    for limit in (1, 2, 7, 16, 17, 33):
        spec = Engine(
            target, OracleDrafter([8, 9] + reference, target.cfg.vocab_size, accept_prob=1.0), max_context=256
        )
        got, finished, _ = run(spec, [8, 9], SamplingParams(max_new_tokens=limit))
        assert got == reference[:limit] and finished.reason == "length"


def test_chunked_prefill_gives_the_same_answer(tiny_dirs, monkeypatch):
    """Long prompts prefill in chunks (bounded masks and feature buffers); the answer must not change."""
    import dflash_chat.engine.spec as spec_module

    target_dir, drafter_dir, _ = tiny_dirs["qwen3_5"]
    target = load_target(target_dir, "cpu", torch.float32)
    prompt = list(range(10, 60))
    params = SamplingParams(max_new_tokens=30)
    whole, _, _ = run(Engine(target, load_drafter(drafter_dir, target), max_context=256), prompt, params)
    monkeypatch.setattr(spec_module, "PREFILL_CHUNK", 7)
    chunked, finished, _ = run(Engine(target, load_drafter(drafter_dir, target), max_context=256), prompt, params)
    assert chunked == whole and finished.stats.prompt_tokens == 50
    ar, _, _ = run(Engine(target, None, max_context=256), prompt, params)
    assert ar == whole


def test_the_host_time_per_step_is_the_loops_own(tiny_dirs):
    """GenerationStats.host_s: the decode loop's host time around the model calls, per method too. It is a part of
    the decode apart from the drafts and verifies, and the time the caller holds each step is not in it."""
    import time

    target_dir, drafter_dir, _ = tiny_dirs["qwen3_5"]
    target = load_target(target_dir, "cpu", torch.float32)
    engine = Engine(target, load_drafter(drafter_dir, target), max_context=256)  # auto: plain, DFlash and lookup
    held, finished = 0.02, None
    for event in engine.generate([4, 5, 6, 7] * 4, SamplingParams(max_new_tokens=40)):
        if isinstance(event, Step):
            time.sleep(held)  # a slow reader of the stream
        finished = event
    assert isinstance(finished, Finished)
    s = finished.stats
    assert s.steps > 1 and s.host_s > 0
    assert all(m.host_s > 0 for m in s.methods.values())
    assert sum(m.host_s for m in s.methods.values()) == pytest.approx(s.host_s)
    assert s.host_s + s.draft_s + s.verify_s <= s.decode_s
    assert s.host_s < held * s.steps / 2  # the reader's time is not the loop's
    record = s.as_dict()
    assert record["host_s"] == s.host_s
    assert {m: v["host_s"] for m, v in record["methods"].items()} == {m: v.host_s for m, v in s.methods.items()}
