"""Greedy DFlash output equals greedy autoregressive output, token for token."""

import random

import pytest
import torch

from dflash_chat.bench.oracle import OracleDrafter
from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.conftest import ARCHS
from tests.engine.helpers import run

BLOCK = 16


def _prompts(vocab, n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 40))] for _ in range(n)]


@pytest.mark.slow(seconds=6)
@pytest.mark.parametrize("arch", ARCHS)
def test_error_injecting_drafter_is_lossless_at_every_acceptance_length(arch, tiny_dirs):
    target_dir, _, _ = tiny_dirs[arch]
    target = load_target(target_dir, "cpu", torch.float32)
    vocab = target.cfg.vocab_size
    params = SamplingParams(max_new_tokens=48)
    ar = Engine(target, None, max_context=256)
    lengths, keeps = set(), set()
    for i, prompt in enumerate(_prompts(vocab, 20, seed=hash(arch) % 1000)):
        expected, _, _ = run(ar, prompt, params)
        ar.reset()
        oracle = OracleDrafter(prompt + expected, vocab, block_size=BLOCK, mode="uniform", seed=i)
        spec = Engine(target, oracle, max_context=256, draft=BLOCK - 1)
        got, finished, events = run(spec, prompt, params)
        assert got == expected, f"prompt {i}: DFlash diverged from autoregressive decoding"
        for e in events[2:-1]:
            lengths.add(e.accepted)
            keeps.add(len(e.token_ids))
        assert finished.stats.new_tokens == len(expected)
    assert lengths == set(range(BLOCK)), f"acceptance lengths seen: {sorted(lengths)}"
    assert set(range(1, BLOCK + 1)) <= keeps


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", [None, True, False])  # None: as the checkpoint says (its sliding layer causal)
def test_real_drafter_module_is_lossless(arch, causal, tiny_dirs):
    target_dir, drafter_dir, _ = tiny_dirs[arch]
    target = load_target(target_dir, "cpu", torch.float32)
    drafter = load_drafter(drafter_dir, target, causal=causal)
    spec = Engine(target, drafter, max_context=256)
    ar = Engine(target, None, max_context=256)
    params = SamplingParams(max_new_tokens=40)
    for prompt in _prompts(target.cfg.vocab_size, 4, seed=7):
        expected, _, _ = run(ar, prompt, params)
        got, finished, _ = run(spec, prompt, params)
        assert got == expected
        assert finished.stats.steps > 0 and finished.stats.drafted > 0
        ar.reset()
        spec.reset()


def test_stop_token_inside_an_accepted_block_ends_the_answer(tiny_dirs):
    target_dir, _, _ = tiny_dirs["qwen3_5"]
    target = load_target(target_dir, "cpu", torch.float32)
    prompt = [5, 17, 99, 3]
    ar = Engine(target, None, max_context=256)
    reference, _, _ = run(ar, prompt, SamplingParams(max_new_tokens=30))
    stop = reference[9]
    first = reference.index(stop)
    oracle = OracleDrafter(prompt + reference, target.cfg.vocab_size, accept_prob=1.0)
    spec = Engine(target, oracle, max_context=256)
    got, finished, _ = run(spec, prompt, SamplingParams(max_new_tokens=30, stop_token_ids=(stop,)))
    assert got == reference[: first + 1]
    assert finished.reason == "stop"
    # the state holds exactly the tokens before the stop token
    assert spec.tokens == prompt + reference[:first]
    assert spec.state.length == len(spec.tokens)
