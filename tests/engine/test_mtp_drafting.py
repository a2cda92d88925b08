"""Drafting with the target's MTP layer: greedy output is plain decoding's, sampled output has the target's
distribution, and the layer's cache after any run of rejections holds exactly the committed tokens' pairs."""

import random

import pytest
import torch

from dflash_chat.engine.load import load_mtp, load_target
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.conftest import MTP_ARCHS
from tests.engine.helpers import run
from tests.engine.mtp_reference import ReferenceMTP
from tests.engine.test_mtp import _mtp_weights, _reference
from tests.engine.test_sampling import P_MIN, _exact_marginals, chi_square_p
from tests.engine.tiny import write_target

V_SMALL = 12


def _prompts(vocab, n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 30))] for _ in range(n)]


def _loaded(folder):
    target = load_target(folder, "cpu", torch.float32)
    return target, load_mtp(folder, target)


@pytest.mark.slow(seconds=8)
@pytest.mark.parametrize("arch", MTP_ARCHS)
def test_greedy_mtp_drafting_is_plain_decoding_at_every_depth(arch, mtp_dirs):
    target, mtp = _loaded(mtp_dirs[arch][0])
    plain = Engine(target, None, max_context=200, speculate="none")
    prompts = list(zip(_prompts(target.cfg.vocab_size, 3, seed=9), (30, 5, 40), strict=True))
    expected = [run(plain, prompt, SamplingParams(max_new_tokens=n))[0] for prompt, n in prompts]
    for draft in (1, 2, 3, "auto"):
        engine = Engine(target, None, mtp=mtp, max_context=200, speculate="mtp", draft=draft)
        for (prompt, n), want in zip(prompts, expected, strict=True):
            got, finished, _ = run(engine, prompt, SamplingParams(max_new_tokens=n))
            assert got == want, f"draft {draft}"
            assert set(finished.stats.methods) <= {"mtp", "plain"} and finished.stats.methods["mtp"].drafted > 0


@pytest.fixture(scope="module")
def small_mtp(tmp_path_factory):
    """A 12-token target with a random MTP layer: its drafts land often enough at T > 0 for every length."""
    root = tmp_path_factory.mktemp("small-mtp")
    hf = write_target(root / "target", "qwen3_5", seed=5, vocab_size=V_SMALL, tokenizer=False, mtp=True)
    return root / "target", hf


def _chained(reference: ReferenceMTP, hf, tokens: list[int], last: int, k: int) -> list[int]:
    with torch.no_grad():
        hidden = hf.model(torch.tensor(tokens)[None]).last_hidden_state[0]
    return reference.chain(hidden, tokens + [last], k)


@pytest.mark.slow(seconds=6)
def test_the_mtp_cache_holds_the_committed_pairs_after_every_acceptance_length(small_mtp):
    """Sampled answers whose MTP drafts (depth 3) were accepted 0, 1, 2 and 3 at a time: after each, the layer's
    newest hidden state is the target's at the last held position and its drafts from there are the
    reference's on the held tokens (every rejected row it stored was rewritten); the next turn reuses them."""
    folder, hf = small_mtp
    target, mtp = _loaded(folder)
    engine = Engine(target, None, mtp=mtp, max_context=200, speculate="mtp", draft=3)
    reference = _reference(hf, _mtp_weights(folder))
    seen: set[int] = set()
    prompt = [1, 4, 7, 2]
    for seed in range(4):
        params = SamplingParams(temperature=1.0, max_new_tokens=30, seed=seed)
        answer, _, events = run(engine, prompt, params)
        seen |= {e.accepted for e in events[2:-1]}
        held = list(engine.tokens)
        with torch.no_grad():
            hidden = hf.model(torch.tensor(held)[None]).last_hidden_state[0]
        torch.testing.assert_close(mtp.last[0], hidden[-1], rtol=0, atol=1e-4)
        drafts = mtp.propose(torch.tensor([answer[-1]]), torch.tensor(len(held)), 200, SamplingParams(), None, None, 3)
        assert drafts.tolist() == _chained(reference, hf, held, answer[-1], 3)
        prompt = held + [answer[-1]] + [3, 5]  # the next turn starts with what the engine holds
    assert seen == {0, 1, 2, 3}


@pytest.mark.slow(seconds=15)
def test_sampled_mtp_drafting_has_the_target_distribution(small_mtp):
    """Tokens 1-3 of 600 seeded generations with sampled MTP drafts (depth 2) against the exact marginals."""
    target, mtp = _loaded(small_mtp[0])
    params = SamplingParams(temperature=0.9, top_k=10, max_new_tokens=3)
    prompt = [1, 4, 7]
    exact = _exact_marginals(target, prompt, params, steps=3)
    engine = Engine(target, None, mtp=mtp, max_context=32, speculate="mtp", draft=2)
    counts, accepted = torch.zeros(3, V_SMALL), 0
    for i in range(600):
        engine.reset()
        tokens, finished, _ = run(engine, prompt, SamplingParams(**{**vars(params), "seed": i}))
        accepted += finished.stats.accepted
        for pos, t in enumerate(tokens):
            counts[pos, t] += 1
    for pos in range(3):
        assert chi_square_p(counts[pos], exact[pos]) > P_MIN, f"token {pos + 1} is not distributed as the target's"
    assert accepted > 10  # drafts were accepted (and rejected): both branches ran
