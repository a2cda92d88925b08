"""At T > 0 speculative decoding samples exactly the target's distribution, with drafts drawn from the drafter's q."""

from dataclasses import replace

import pytest
import torch

from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.models.target import TargetModel
from dflash_chat.engine.sampling import Draws, accept, probabilities, sample
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.helpers import run
from tests.engine.tiny import write_drafter, write_target

P_MIN = 1e-3  # reject the "same distribution" hypothesis only below this p-value


def chi_square_p(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test; cells with tiny expectation are pooled."""
    n = observed.sum()
    expected = expected_probs.double() * n
    big = expected >= 5
    obs = torch.cat((observed[big].double(), observed[~big].double().sum()[None]))
    exp = torch.cat((expected[big], expected[~big].sum()[None]))
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))


def test_chi_square_helper_rejects_a_wrong_distribution():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.3, 0.3, 0.4])
    draws = torch.multinomial(q, 3000, replacement=True, generator=gen)
    assert chi_square_p(torch.bincount(draws, minlength=3), p) < P_MIN
    draws = torch.multinomial(p, 3000, replacement=True, generator=gen)
    assert chi_square_p(torch.bincount(draws, minlength=3), p) > P_MIN


def test_top_k_top_p_and_min_p_keep_what_their_definitions_say():
    """Against the definitions spelled out over the whole vocabulary (transformers' order): keep the k best,
    softmax at the temperature, then the smallest prefix reaching top_p, then those at least min_p times the
    likeliest, renormalise."""
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(2)) * 3
    for params in (
        SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=0.5, top_p=0.6),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, min_p=0.05),
        SamplingParams(temperature=0.8, top_k=50, min_p=0.1),
        SamplingParams(temperature=1.2, top_p=0.9, min_p=0.02),
    ):
        got = probabilities(logits, params)
        want = _definitional(logits, params)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        assert torch.equal(got > 0, want > 0)
    wide = probabilities(logits, SamplingParams(temperature=1.0, min_p=0.05))
    assert (wide > 0).sum(-1).max() < 1000  # min-p did drop tokens here


def _emitted(logits, draft, params, gen, stop_ids=(-1,), remaining=99, q=None) -> list[int]:
    draws = Draws.empty(logits.shape[0], logits.shape[1], logits.device).fill(gen)
    if q is None and not params.greedy:  # a drafter that proposes fixed tokens: one-hot q
        q = torch.nn.functional.one_hot(draft, logits.shape[1]).float()
    out = accept(logits, draft, params, draws, torch.tensor(remaining), torch.tensor(stop_ids), q).tolist()
    T = logits.shape[0]
    return out[: out[T]]


def test_acceptance_rule_preserves_the_distribution_with_fixed_drafts():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 12, generator=gen) * 2
    draft = torch.tensor([3, 7, 1])  # fixed and often wrong
    params = SamplingParams(temperature=0.8, top_k=8, top_p=0.9)
    target = probabilities(logits[0], params)
    counts = torch.zeros(12)
    for _ in range(3000):
        emitted = _emitted(logits, draft, params, gen)
        counts[emitted[0]] += 1  # the first token out: draft[0] if accepted, else the target's own
    assert chi_square_p(counts, target) > P_MIN


@pytest.mark.parametrize("top_k, min_p", [(8, 0.0), (0, 0.0), (8, 0.05), (0, 0.05)])
def test_acceptance_rule_preserves_the_distribution_with_sampled_drafts(top_k, min_p):
    """Drafts drawn from a q unlike p (its own top-k): the first token out follows p, the next one after an
    accepted draft follows p's next row, and the first draft is accepted with probability sum(min(p, q)).
    With top-k on, the rule works on p's k candidates; without, on the whole vocabulary; p is held to its
    definition (with min-p, too)."""
    gen = torch.Generator().manual_seed(3)
    V = 12
    logits = torch.randn(3, V, generator=gen) * 2
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=0.9, min_p=min_p)
    q = probabilities(logits[:2] + torch.randn(2, V, generator=gen), SamplingParams(temperature=1.5, top_k=6))
    first, second, accepted = torch.zeros(V), torch.zeros(V), 0
    n = 4000
    for _ in range(n):
        draft = sample(q, torch.empty_like(q).exponential_(generator=gen))
        emitted = _emitted(logits, draft, params, gen, q=q)
        first[emitted[0]] += 1
        if emitted[0] == draft[0]:  # accepted (a rejection never resamples the rejected draft)
            accepted += 1
            second[emitted[1]] += 1  # row 1 is p after the accepted draft
    p = _definitional(logits, params)
    if min_p:  # the cut changes p here: it keeps 2 of the 3 tokens top-p keeps
        assert (p[0] > 0).sum() < (_definitional(logits, replace(params, min_p=0.0))[0] > 0).sum()
    assert chi_square_p(first, p[0]) > P_MIN
    assert chi_square_p(second, p[1]) > P_MIN
    rate = float(torch.minimum(p[0], q[0]).sum())
    assert 0.1 < rate < 0.9
    assert abs(accepted / n - rate) < 4 * (rate * (1 - rate) / n) ** 0.5 + 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_the_rule_on_top_k_candidates_emits_what_the_rule_over_the_vocabulary_emits(seed):
    """With top-k on, the rule compares and draws among p's k candidates only. Given the noise those columns
    read, set where the candidates sit in the whole vocabulary, the rule written over every column (by hand
    here) emits the same tokens."""
    gen = torch.Generator().manual_seed(seed)
    T, V, k = 16, 40, 7
    logits = torch.randn(T, V, generator=gen) * 2
    params = SamplingParams(temperature=0.8, top_k=k, top_p=0.9)
    near = logits[: T - 1] + torch.randn(T - 1, V, generator=gen) * 0.5
    q = probabilities(near, SamplingParams(temperature=1.2, top_k=9))
    drafts = sample(q, torch.empty_like(q).exponential_(generator=gen))
    draws = Draws.empty(T, V, logits.device).fill(gen)
    out = accept(logits, drafts, params, draws, torch.tensor(99), torch.tensor([-1]), q).tolist()

    p = probabilities(logits, params)
    wide = torch.full((T, V), float("inf"))  # 0 chance outside the candidates
    wide.scatter_(1, logits.topk(k).indices, draws.noise[:, :k])
    ok = draws.uniform[: T - 1] * q.gather(1, drafts[:, None])[:, 0] < p[: T - 1].gather(1, drafts[:, None])[:, 0]
    accepted = int(ok.long().cumprod(0).sum())
    residual = torch.cat(((p[: T - 1] - q).clamp(min=0.0), p[T - 1 :]))
    resampled = (residual / wide).argmax(dim=-1).tolist()  # every row's, as the rule draws them at once
    assert out[T] == accepted + 1 and out[T + 1] == accepted
    assert out[:T] == drafts[:accepted].tolist() + resampled[accepted:]


def test_acceptance_rule_resamples_later_positions_from_the_residual():
    """With the first draft certain, the second token out follows p_target(. | position 1) exactly."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 10, generator=gen)
    logits[0] = -1e4
    logits[0, 4] = 1e4  # the target is sure of draft 0 = 4
    draft = torch.tensor([4, 6])
    params = SamplingParams(temperature=1.0)
    counts = torch.zeros(10)
    for _ in range(3000):
        emitted = _emitted(logits, draft, params, gen)
        assert emitted[0] == 4
        counts[emitted[1]] += 1
    assert chi_square_p(counts, probabilities(logits[1], params)) > P_MIN


def test_acceptance_rule_cuts_at_a_stop_token_and_at_the_tokens_left():
    logits = torch.full((5, 8), -10.0)
    for i, t in enumerate([2, 5, 7, 1, 3]):
        logits[i, t] = 10.0  # the target's argmax per row
    greedy = SamplingParams()
    assert _emitted(logits, torch.tensor([2, 5, 7, 1]), greedy, None) == [2, 5, 7, 1, 3]  # all accepted + bonus
    assert _emitted(logits, torch.tensor([2, 0, 7, 1]), greedy, None) == [2, 5]  # correction at the rejection
    assert _emitted(logits, torch.tensor([2, 5, 7, 1]), greedy, None, stop_ids=(7, -1)) == [2, 5, 7]
    assert _emitted(logits, torch.tensor([2, 5, 7, 1]), greedy, None, remaining=2) == [2, 5]
    # a stop id past the emitted tokens does not cut them
    assert _emitted(logits, torch.tensor([2, 0, 7, 1]), greedy, None, stop_ids=(7, -1)) == [2, 5]


V_SMALL = 12


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    """A 12-token target and a random drafter for it: a drafter deliberately unlike its target."""
    root = tmp_path_factory.mktemp("small")
    write_target(root / "target", "qwen3_5", seed=5, vocab_size=V_SMALL, tokenizer=False)
    model = load_target(root / "target", "cpu", torch.float32)
    drafters = {}
    for block in (4, 16):
        write_drafter(root / f"drafter{block}", root / "target", seed=6, block_size=block)
        drafters[block] = root / f"drafter{block}"
    return model, drafters


@pytest.fixture(scope="module")
def small_pair_marginals(small_pair):
    """The exact marginals of tokens 1-3 after [1, 4, 7] at T = 0.9, top-k 10 (both tests below ask for them)."""
    return _exact_marginals(
        small_pair[0], [1, 4, 7], SamplingParams(temperature=0.9, top_k=10, max_new_tokens=3), steps=3
    )


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize("block,draft", [(16, 15), (4, "auto")])
def test_speculative_sampling_matches_the_target_distribution(block, draft, small_pair, small_pair_marginals):
    """Tokens 1-3 of 800 seeded generations with sampled drafts from a mismatched drafter against the exact
    marginals: whole blocks of 16, and `auto` (plain steps or whole blocks) with a block of 4."""
    model, drafters = small_pair
    prompt = [1, 4, 7]
    exact = small_pair_marginals
    engine = Engine(model, load_drafter(drafters[block], model), max_context=32, draft=draft)
    counts = torch.zeros(3, V_SMALL)
    accepted, plain_steps, drafted_steps = 0, 0, 0
    for i in range(800):
        engine.reset()
        # no draft memory: each answer starts from the fixed priors, as a new engine's first (auto drafts, then judges)
        tokens, finished, _ = run(engine, prompt, SamplingParams(temperature=0.9, top_k=10, max_new_tokens=3, seed=i))
        accepted += finished.stats.accepted
        plain_steps += finished.stats.draft_histogram[0]
        drafted_steps += sum(finished.stats.draft_histogram[1:])
        for pos, t in enumerate(tokens):
            counts[pos, t] += 1
    for pos in range(3):
        assert chi_square_p(counts[pos], exact[pos]) > P_MIN, f"token {pos + 1} is not distributed as the target's"
    assert accepted > 10  # sampled drafts were accepted (and rejected): both branches ran
    if draft == "auto":
        assert plain_steps and drafted_steps  # both kinds of step, as auto chose


@pytest.mark.slow(seconds=12)
def test_speculative_sampling_with_min_p_has_the_definitional_distribution(small_pair):
    """min-p on the whole vocabulary (no top-k): tokens 1-2 of 600 seeded generations with sampled drafts from
    the mismatched drafter follow the marginals of the definitional distribution (the cut written by hand)."""
    model, drafters = small_pair
    params = SamplingParams(temperature=1.1, top_p=0.95, min_p=0.12, max_new_tokens=2)
    prompt = [1, 4, 7]
    exact = _exact_marginals(model, prompt, params, steps=2, processed=_definitional)
    assert int((exact[0] > 0).sum()) < V_SMALL  # min-p cut some tokens here
    engine = Engine(model, load_drafter(drafters[16], model), max_context=32, draft=15)
    counts = torch.zeros(2, V_SMALL)
    for i in range(600):
        engine.reset()
        tokens, _, _ = run(engine, prompt, SamplingParams(**{**vars(params), "seed": i}))
        for pos, token in enumerate(tokens):
            counts[pos, token] += 1
    for pos in range(2):
        assert chi_square_p(counts[pos], exact[pos]) > P_MIN, f"token {pos + 1} is not distributed as defined"


def _draft_once(engine, prompt, last, params, generator):
    """Prefill `prompt`, draft after `last` and verify the first draft: (q [B-1, V], drafts accepted)."""
    engine.reset()
    steps = engine.steps
    steps.prefill(prompt, final=True)
    engine.tokens = list(prompt)
    steps.begin(last, len(prompt), params, generator)
    steps.draft(steps.B)  # every draft row: q is compared whole
    q = steps.q.clone()
    steps.verify(2, 99)
    steps.commit(2)
    return q, steps.read().accepted


@pytest.mark.slow(seconds=9)
def test_drafts_processed_q_and_acceptance_on_a_fixed_context(small_pair):
    """q is the draft logits processed by the definitions (temperature, top-k, top-p), and the first draft is
    accepted at the rate sum(min(p, q)) within sampling error."""
    model, drafters = small_pair
    drafter = load_drafter(drafters[16], model)
    engine = Engine(model, drafter, max_context=32, draft=1)
    prompt, last = [2, 9, 3, 1], 6
    params = SamplingParams(temperature=0.7, top_k=8, top_p=0.9)
    generator = torch.Generator().manual_seed(4)
    q, _ = _draft_once(engine, prompt, last, params, generator)

    context = Engine(model, drafter, max_context=32, draft="off")  # the drafter's logits by its eager view
    context.steps.prefill(prompt, final=True)
    draft_logits = drafter.logits(drafter.draft_hidden(last, len(prompt)))
    torch.testing.assert_close(q, _definitional(draft_logits, params), rtol=1e-5, atol=1e-6)

    logits, _ = model(torch.tensor(prompt + [last]), model.new_state(16), logits="last")
    rate = float(torch.minimum(probabilities(logits, params), q[0]).sum())
    n = 600
    accepted = sum(_draft_once(engine, prompt, last, params, generator)[1] for _ in range(n))
    assert 0.05 < rate < 0.95
    assert abs(accepted / n - rate) < 4 * (rate * (1 - rate) / n) ** 0.5


def _definitional(logits, params):
    """Temperature, top-k, top-p and min-p by their definitions over the whole vocabulary, row by row."""
    out = torch.zeros(logits.shape, dtype=torch.float32)
    for i, row in enumerate(logits.reshape(-1, logits.shape[-1])):
        order = torch.argsort(row, descending=True)
        keep = order[: params.top_k] if params.top_k else order
        p = torch.softmax(row[keep].float() / params.temperature, dim=-1)
        n = len(p) if params.top_p == 1 else int((torch.cumsum(p, 0) - p < params.top_p).sum())
        kept = [j for j in range(n) if p[j] >= params.min_p * p[0]]
        out.view(-1, logits.shape[-1])[i, keep[kept]] = p[kept] / p[kept].sum()
    return out


def _exact_marginals(model: TargetModel, prompt, params, steps, processed=probabilities):
    """P(token at step s = x) for s < steps, by enumerating all prefixes (small vocab); `processed` turns the
    target's logits into its distribution."""
    V = model.cfg.vocab_size
    marginals = []
    frontier = {(): 1.0}
    for _ in range(steps):
        dist = torch.zeros(V, dtype=torch.float64)
        nxt = {}
        for prefix, weight in frontier.items():
            if weight == 0:  # a token top-k cut: it adds nothing to any later step
                continue
            state = model.new_state(len(prompt) + steps)
            logits, _ = model(torch.tensor(prompt + list(prefix)), state, logits="last")
            p = processed(logits, params).double()
            dist += weight * p
            for x in range(V):
                nxt[prefix + (x,)] = weight * p[x].item()
        marginals.append(dist)
        frontier = nxt
    return marginals


def test_seeded_sampling_is_reproducible(tiny_dirs):
    target = load_target(tiny_dirs["qwen3_5"][0], "cpu", torch.float32)
    engine = Engine(target, None, max_context=128)
    params = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=12, seed=123)
    first, _, _ = run(engine, [3, 4, 5], params)
    engine.reset()
    second, _, _ = run(engine, [3, 4, 5], params)
    assert first == second
