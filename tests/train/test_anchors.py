"""Where training blocks start (train/anchors.py): the weights against the engine's own draft and the
target's distribution, and the draw."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dflash_chat.bench.demo_pair import bench_prompts
from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.sampling import probabilities
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from dflash_chat.models.demo import demo_paths
from dflash_chat.train.anchors import lean_to_engine_anchors, mixed_chances, residual_weights
from dflash_chat.train.drafter import Sequence, draw_anchors, load_for_training, sample_anchors, teach_all
from tests.engine.helpers import run

APP = SamplingParams(temperature=0.7, top_p=0.8, top_k=20)


def test_the_draw_is_distinct_ascending_and_in_proportion_to_the_chances():
    rng = random.Random(0)
    chances = [0.0, 0.6, 0.3, 0.1]
    for _ in range(20):
        got = draw_anchors(chances, 2, rng)
        assert got == sorted(set(got)) and len(got) == 2 and 0 not in got
    firsts = [draw_anchors(chances, 1, rng)[0] for _ in range(4000)]
    for i, c in enumerate(chances):
        assert firsts.count(i) / 4000 == pytest.approx(c, abs=0.03)


def test_mixed_chances_split_between_uniform_and_the_weights():
    valid = torch.tensor([False, True, True, True, False])
    weights = torch.tensor([5.0, 0.0, 1.0, 3.0, 9.0])  # weight outside the valid span counts for nothing
    mixed = mixed_chances(weights, valid, 0.5)
    torch.testing.assert_close(mixed, torch.tensor([0.0, 1 / 6, 1 / 6 + 0.125, 1 / 6 + 0.375, 0.0]))
    torch.testing.assert_close(mixed_chances(weights, valid, 0.0), valid.float() / 3)
    torch.testing.assert_close(mixed_chances(torch.zeros(5), valid, 1.0), valid.float() / 3)  # no weight: uniform


@torch.no_grad()
def test_the_weights_are_one_minus_the_engines_first_draft_chance_over_the_targets():
    """max(0, 1 - q1(x[s]) / p(x[s])): q1 the first draft's distribution the engine's own DFlash2 step draws
    from, in the block anchored at s - 1; p the target's at the app's settings, over the whole vocabulary."""
    target_dir, drafter_dir = demo_paths("dflash2")
    model = load_target(target_dir, dtype=torch.float32)
    engine = Engine(model, load_drafter(drafter_dir, model), max_context=96, draft=15)
    prompt = AutoTokenizer.from_pretrained(target_dir)(bench_prompts()["raw_code"][0])["input_ids"]
    answer, _, _ = run(engine, prompt, SamplingParams(temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=24, seed=1))
    ids = prompt + answer  # the target's own sampled answer: every token inside its nucleus
    start = len(prompt) - 1

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)
    trainer, _ = load_for_training(drafter_dir, hf)
    seq = Sequence(torch.tensor(ids), start=start)
    taught = teach_all(hf, [seq], trainer.target_layer_ids, "cpu")
    weights = residual_weights(trainer, hf, seq, taught[0], APP)
    assert not weights[: start + 1].any() and weights[-1] == 0.0  # no block before the answer; none after it

    steps = engine.steps
    inside = 0
    for s in range(start + 1, len(ids) - 1):
        engine.reset()
        steps.prefill(ids[: s - 1], final=True)
        engine.tokens = ids[: s - 1]
        steps.begin(ids[s - 1], s - 1, APP, torch.Generator().manual_seed(0))
        steps.draft(steps.B)
        q = float(steps.q[0, ids[s]])
        logits, _ = model(torch.tensor(ids[:s]), model.new_state(len(ids)), logits="last")
        p = float(probabilities(logits.reshape(-1, logits.shape[-1]), APP)[-1, ids[s]])
        assert p > 0  # the target drew it
        want = max(0.0, 1.0 - q / p)
        assert float(weights[s]) == pytest.approx(want, abs=3e-3)  # the teacher keeps its logits in float16
        inside += 0.05 < want < 0.95
    assert inside >= 3  # weights strictly between: both q and p mattered

    lean_to_engine_anchors(trainer, hf, [seq], taught, APP, 1.0)
    assert seq.chances is not None and float(seq.chances.sum()) == pytest.approx(1.0)
    drawn = [a for i in range(200) for a in sample_anchors(seq, 1, random.Random(i))]
    assert all(float(weights[a]) > 0 for a in drawn)  # share 1: only where the engine's steps would start
