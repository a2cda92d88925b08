"""The expected sampled acceptance the DFlash2 selector is fitted and trained on (train/losses.py,
train/dflash2.py): against a direct count, and its gradient raises it."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dflash_chat.bench.demo_pair import bench_prompts
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.models.demo import demo_paths
from dflash_chat.train.dflash2 import forced_scores, sampled_accepts, selector_loss
from dflash_chat.train.drafter import Sequence, load_for_training, pack_blocks, sample_anchors, teach_all
from dflash_chat.train.losses import candidate_probs, expected_accepted


def test_expected_accepted_is_the_sum_of_the_chances_that_every_draft_so_far_landed():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 3, 4, generator=gen), dim=-1)
    q = torch.softmax(torch.randn(2, 3, 4, generator=gen), dim=-1)
    valid = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the second block's sequence ends after 2 drafts
    want = []
    for a in range(2):
        total, run = 0.0, 1.0
        for j in range(3):
            landed = sum(min(float(p[a, j, k]), float(q[a, j, k])) for k in range(4)) if valid[a, j] else 0.0
            run *= landed
            total += run
        want.append(total)
    torch.testing.assert_close(expected_accepted(p, q, valid), torch.tensor(want), rtol=1e-6, atol=1e-6)


def test_candidate_probs_are_the_processed_target_probabilities_of_the_candidates():
    top_logits = torch.tensor([[4.0, 3.0, 1.0, 0.5, -1.0, -2.0]])
    top_ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    ids = torch.tensor([[11, 10, 99]])  # 99: not among the target's best: no mass
    sampling = SamplingParams(temperature=0.7, top_p=0.8, top_k=20)
    probs = torch.softmax(top_logits[0] / 0.7, dim=-1)
    kept = [i for i in range(6) if probs[:i].sum() < 0.8]  # the smallest prefix reaching 0.8
    nucleus = torch.zeros(6)
    nucleus[kept] = probs[kept] / probs[kept].sum()
    got = candidate_probs(ids, top_ids, top_logits, sampling)
    torch.testing.assert_close(
        got, torch.stack([nucleus[1], nucleus[0], torch.tensor(0.0)])[None], rtol=1e-6, atol=1e-6
    )


@pytest.fixture(scope="module")
def blocks_of_text():
    target_dir, drafter_dir = demo_paths("dflash2")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    drafter, _ = load_for_training(drafter_dir, target)
    sequences = [Sequence(torch.tensor(tokenizer(t)["input_ids"]), start=1) for t in bench_prompts()["raw_code"][:3]]
    taught = teach_all(target, sequences, drafter.target_layer_ids, "cpu")
    rng = random.Random(0)
    anchors = [sample_anchors(s, 8, rng) for s in sequences]
    feats, blocks, packed = pack_blocks(sequences, taught, anchors, drafter.block_size, drafter.mask_token_id, "cpu")
    with torch.no_grad():
        hidden = drafter.forward_train(feats, target.get_input_embeddings()(blocks.tokens), packed)[:, 1:]
        logits = drafter.logits(hidden)
    return drafter, hidden, logits, blocks


def test_the_accept_term_raises_the_expected_sampled_acceptance(blocks_of_text):
    drafter, hidden, logits, blocks = blocks_of_text
    app = SamplingParams(temperature=0.7, top_p=0.8, top_k=20)
    selector = drafter.candidate_selector
    weights = torch.ones(blocks.labels.shape[1])

    def accepts() -> float:
        with torch.no_grad():
            return sampled_accepts(*forced_scores(drafter, hidden, logits, blocks), blocks, app).mean().item()

    before = accepts()
    optimizer = torch.optim.SGD(selector.parameters(), lr=0.05)
    for _ in range(5):
        plain_loss, _ = selector_loss(drafter, hidden, logits, blocks, weights)
        with_accept, _ = selector_loss(drafter, hidden, logits, blocks, weights, accept=1.0)
        optimizer.zero_grad()
        (with_accept - plain_loss).backward()  # the accept term alone
        optimizer.step()
    assert accepts() > before + 0.01
