"""The DFlash2 selector's fitted scale (train/calibrate.py): written into the checkpoint it scales every score
alike, leaves the greedy walk as it was, and the fit finds the scale that undoes a deliberately sharpened
selector."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dflash_chat.bench.demo_pair import bench_prompts
from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.models.demo import demo_paths
from dflash_chat.train.calibrate import apply_scale, best_scale, expected_accepts
from dflash_chat.train.drafter import Sequence, load_for_training, save_drafter

APP = SamplingParams(temperature=0.7, top_p=0.8, top_k=20)


@pytest.fixture(scope="module")
def pair():
    target_dir, drafter_dir = demo_paths("dflash2")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    texts = bench_prompts()["raw_code"][:4]
    sequences = [Sequence(torch.tensor(tokenizer(t)["input_ids"]), start=1) for t in texts]
    return target_dir, drafter_dir, target, sequences


def _scores(drafter, hidden: torch.Tensor, before: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    selector = drafter.candidate_selector
    unary, ids, successors, projected = selector.candidates(drafter.logits(hidden), hidden)
    return ids, selector.scores(unary, successors, projected, before[:, None])[:, 0]


@pytest.mark.parametrize("softcap", [None, 4.0])
@torch.no_grad()
def test_a_scale_multiplies_every_selector_score(pair, softcap):
    _, drafter_dir, target, _ = pair
    drafter, config = load_for_training(drafter_dir, target)
    if softcap is not None:
        drafter.cfg.dflash2 = replace(drafter.cfg.dflash2, final_logit_softcapping=softcap)
        config["dflash_config"]["final_logit_softcapping"] = softcap
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, drafter.cfg.hidden_size, generator=gen)
    before = torch.randint(0, target.config.vocab_size, (12,), generator=gen)
    ids, scores = _scores(drafter, hidden, before)
    multiplier = config["dflash_config"].get("output_multiplier", 1.0)
    apply_scale(drafter, config, 0.6)
    scaled_ids, scaled = _scores(drafter, hidden, before)
    assert torch.equal(scaled_ids, ids)  # the same candidates
    torch.testing.assert_close(scaled, 0.6 * scores, rtol=1e-5, atol=1e-5)
    assert config["dflash_config"]["output_multiplier"] == pytest.approx(0.6 * multiplier)
    if softcap is not None:
        assert config["dflash_config"]["final_logit_softcapping"] == pytest.approx(0.6 * softcap)


@torch.no_grad()
def test_a_saved_scale_loads_into_the_engine_with_the_same_greedy_drafts(pair, tmp_path):
    target_dir, drafter_dir, target, _ = pair
    drafter, config = load_for_training(drafter_dir, target)
    multiplier = config["dflash_config"].get("output_multiplier", 1.0)
    apply_scale(drafter, config, 0.5)  # a power of two: bf16 weights scale without rounding
    save_drafter(drafter, config, tmp_path / "drafter2")
    saved = json.loads((tmp_path / "drafter2" / "config.json").read_text())
    assert saved["dflash_config"]["output_multiplier"] == 0.5 * multiplier
    model = load_target(target_dir, "cpu", torch.float32)
    drafts = {}
    for name, folder in (("shipped", drafter_dir), ("scaled", tmp_path / "drafter2")):
        engine_drafter = load_drafter(folder, model)
        engine_drafter.allocate(64)
        gen = torch.Generator().manual_seed(1)
        engine_drafter.append_context(torch.randn(20, engine_drafter.fc.in_features, generator=gen), 20)
        ids = engine_drafter.block_ids(torch.device("cpu")).clone()
        ids[0] = 7
        drafts[name] = engine_drafter.propose(
            ids, Span.eager(20, ids.shape[0], ids.device), SamplingParams(), None, None
        )
    assert drafts["scaled"].tolist() == drafts["shipped"].tolist()


@torch.no_grad()
def test_the_fit_undoes_a_sharpened_selector(pair):
    _, drafter_dir, target, sequences = pair
    drafter, config = load_for_training(drafter_dir, target)
    drafter.eval()
    shipped = expected_accepts(drafter, target, sequences, APP, scales=(1.0,), anchors_per_seq=16)[1.0]
    sharpened = copy.deepcopy(drafter)
    apply_scale(sharpened, copy.deepcopy(config), 3.0)
    accepts = expected_accepts(sharpened, target, sequences, APP, scales=(1.0, 1 / 3), anchors_per_seq=16)
    assert best_scale(accepts) == pytest.approx(1 / 3)
    assert accepts[1 / 3] == pytest.approx(shipped, rel=1e-4)  # the same blocks, the same scores
    assert 0 < accepts[1.0] < accepts[1 / 3] <= drafter.block_size - 1
