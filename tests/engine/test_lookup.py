"""Prompt lookup: the proposer finds the longest earlier match of the text's end, and its drafts keep greedy output
plain decoding's and sampled output distributed as the target's."""

import random

import pytest
import torch

from dflash_chat.engine.load import load_target
from dflash_chat.engine.lookup import MAX_MATCH, PromptLookup
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.conftest import ARCHS
from tests.engine.helpers import run
from tests.engine.test_sampling import P_MIN, _exact_marginals, chi_square_p
from tests.engine.tiny import write_target


def _lookup(tokens: list[int]) -> PromptLookup:
    lookup = PromptLookup()
    lookup.extend(tokens)
    return lookup


def test_the_proposal_follows_the_longest_earlier_match_of_the_end():
    #         0  1  2  3  4  5  6  7  8  9 10 11 12 13
    text = [5, 1, 2, 9, 8, 3, 1, 2, 7, 6, 4, 3, 1, 2]
    match = _lookup(text).propose(4)
    assert match is not None and match.length == 3  # [3, 1, 2] at 5-7 beats [1, 2] at 1-2
    assert match.tokens == [7, 6, 4, 3]  # what followed it, up to `most`
    assert _lookup(text).propose(40).tokens == [7, 6, 4, 3, 1, 2]  # up to the end of the text


def test_among_equal_matches_the_most_recent_wins_and_the_end_is_not_its_own_match():
    text = [1, 2, 8, 0, 1, 2, 9, 0, 1, 2]
    match = _lookup(text).propose(2)
    assert match is not None and match.tokens == [9, 0] and match.length == 3  # [0, 1, 2] ends at 6 and at 2
    assert _lookup([4, 5, 6, 7]).propose(3) is None  # nothing earlier
    assert _lookup([3, 3, 3]).propose(3).tokens == [3, 3, 3]  # an overlapping repeat proposes itself, on
    long = list(range(100)) * 2
    assert _lookup(long).propose(1).length == MAX_MATCH  # a long match counts as MAX_MATCH


def test_a_loop_is_proposed_as_far_as_asked():
    """A match that covers its own distance to the end (the text repeats with that period) is copied on past the
    end, LZ77-style; a match shorter than that distance proposes only what followed it."""
    loop = [9, 8] + [1, 2, 3] * 4  # period 3, the end [.., 1, 2, 3] matched 9 tokens back from 3 before it
    match = _lookup(loop).propose(8)
    assert match is not None and match.length == 9 and match.tokens == [1, 2, 3, 1, 2, 3, 1, 2]
    once = [1, 2, 3, 7, 7, 1, 2, 3]  # [1, 2, 3] at 0-2 matched, 5 tokens before the end: no loop
    assert _lookup(once).propose(8).tokens == [7, 7, 1, 2, 3]


def test_truncation_forgets_exactly_the_tokens_dropped():
    text = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2]
    lookup = _lookup(text)
    lookup.truncate(7)  # [1, 2, 3, 4, 1, 2, 5]
    lookup.extend([9, 1, 2])
    fresh = _lookup([1, 2, 3, 4, 1, 2, 5, 9, 1, 2])
    assert lookup.propose(5) == fresh.propose(5) and lookup._ends == fresh._ends


V_SMALL = 12
# every pair (4, x) and (x, 4) occurs: whatever the target writes, the text's end has an earlier match
COVERING = [t for x in range(V_SMALL) for t in (4, x)] + [4]


@pytest.fixture(scope="module")
def small_targets(tmp_path_factory):
    """arch -> a 12-token target (lookup's drafts from COVERING land often enough to see both branches)."""
    out = {}
    for arch, seed in zip(ARCHS, (31, 32, 30), strict=True):
        root = tmp_path_factory.mktemp(f"small-lookup-{arch}")
        write_target(root / "target", arch, seed=seed, vocab_size=V_SMALL, tokenizer=False)
        out[arch] = load_target(root / "target", "cpu", torch.float32)
    return out


@pytest.mark.slow(seconds=6)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_lookup_drafting_is_plain_decoding(arch, small_targets):
    """At a fixed length (short proposals padded) and with `auto`, after prompts whose end always matches."""
    target = small_targets[arch]
    plain = Engine(target, None, max_context=256, speculate="none")
    rng = random.Random(4)
    prompts = [COVERING + [rng.randrange(V_SMALL) for _ in range(rng.randint(0, 6))] for _ in range(3)]
    params = SamplingParams(max_new_tokens=40)
    expected = [run(plain, prompt, params)[0] for prompt in prompts]
    for draft in (5, "auto"):
        engine = Engine(target, None, max_context=256, speculate="lookup", draft=draft)
        accepted = 0
        for prompt, want in zip(prompts, expected, strict=True):
            got, finished, _ = run(engine, prompt, params)
            assert got == want, f"draft {draft}"
            lookup = finished.stats.methods.get("lookup")
            accepted += lookup.accepted if lookup else 0
        # at a fixed length lookup drafts whenever the end matches, and its drafts landed (what auto does depends
        # on this machine's step timings)
        assert accepted > 0 or draft == "auto"


@pytest.mark.slow(seconds=12)
def test_sampled_lookup_drafting_has_the_target_distribution(small_targets):
    """Tokens 1-3 of 600 seeded generations, lookup proposing 3 tokens every step (the prompt's end always
    matches): a one-hot q, accepted with p(d), still samples the target's exact marginals."""
    target = small_targets["qwen3_5"]
    params = SamplingParams(temperature=0.9, top_k=10, max_new_tokens=3)
    exact = _exact_marginals(target, COVERING, params, steps=3)
    engine = Engine(target, None, max_context=64, speculate="lookup", draft=3)
    counts, drafted, accepted = torch.zeros(3, V_SMALL), 0, 0
    for i in range(600):
        engine.reset()
        tokens, finished, _ = run(engine, COVERING, SamplingParams(**{**vars(params), "seed": i}))
        drafted += finished.stats.drafted
        accepted += finished.stats.accepted
        for pos, t in enumerate(tokens):
            counts[pos, t] += 1
    for pos in range(3):
        assert chi_square_p(counts[pos], exact[pos]) > P_MIN, f"token {pos + 1} is not distributed as the target's"
    assert 0 < accepted < drafted  # drafts were accepted and rejected: both branches ran


def test_a_matchs_length_is_the_token_by_token_count_on_repetitive_texts():
    """The match length (found by halving over slices) is the count of equal tokens back from both ends, at most
    MAX_MATCH and never past the text's start, on every pair of positions of short repetitive texts."""
    import random

    from dflash_chat.engine import lookup

    def counted(tokens: list[int], candidate: int, end: int) -> int:
        n = 0
        while n < lookup.MAX_MATCH and candidate - n >= 0 and tokens[candidate - n] == tokens[end - n]:
            n += 1
        return n

    rng = random.Random(0)
    for _ in range(60):
        period = [rng.randrange(3) for _ in range(rng.randint(2, 40))]
        index = lookup.PromptLookup()
        index.extend((period * 6)[: rng.randint(3, 150)])
        tokens = index.tokens
        for end in range(1, len(tokens)):
            for candidate in range(end):
                assert index._matched(candidate, end) == counted(tokens, candidate, end), (candidate, end)
