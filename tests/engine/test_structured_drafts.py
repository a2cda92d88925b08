"""Drafts held to the grammar as they are drawn (engine/structured.StepGuide, sampling.guided_draft): a model's
drafts (DFlash, DFlash2, MTP) are drawn from q masked to what the grammar allows after the drafts before them, so
none is one it refuses, q is the masked and renormalised distribution they were drawn from, and the output is
exactly plain constrained decoding's: token for token when greedy, in distribution when sampled."""

import json

import pytest
import torch

from dflash_chat.engine.constraint import Constraint
from dflash_chat.engine.load import load_drafter, load_mtp, load_target
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from dflash_chat.engine.structured import Grammars, allowed_tokens
from tests.engine.test_sampling import P_MIN, chi_square_p
from tests.engine.test_structured import TINY_GRAMMAR, WORDS, V, _constrained_marginals
from tests.engine.tiny import write_drafter, write_target

# a first token among four, two forced, then a run of letters (never "i" or "j" again) and the end
LONG_GRAMMAR = 'root ::= ("a" | "b" | "c" | "d") "i" "j" ("e" | "a" | "f") ("g" | "b" | "h" | "c" | "k")+'
METHODS = ("dflash", "dflash2", "mtp", "lookup", "auto")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A 12-token target with an MTP layer, a DFlash and a DFlash2 drafter for it (blocks of 4), all random: most
    of what they would draft unheld the grammar refuses. DFlash2's logits are scaled up so its q is peaked."""
    root = tmp_path_factory.mktemp("held-drafts")
    write_target(root / "target", "qwen3_5", seed=5, vocab_size=V, tokenizer=False, mtp=True)
    write_drafter(root / "dflash", root / "target", seed=6, block_size=4)
    cfg = write_drafter(root / "dflash2", root / "target", seed=8, block_size=4, dflash2=True)
    cfg["dflash_config"]["output_multiplier"] = 6.0
    (root / "dflash2" / "config.json").write_text(json.dumps(cfg))
    return root


def _engine(root, method: str, draft=3) -> Engine:
    target = load_target(root / "target", "cpu", torch.float32)
    kwargs: dict = dict(max_context=64, end_ids=(0,), draft=draft)
    if method in ("dflash", "dflash2", "auto"):
        kwargs["drafter"] = load_drafter(root / ("dflash2" if method == "dflash2" else "dflash"), target)
    if method in ("mtp", "auto"):
        kwargs["mtp"] = load_mtp(root / "target", target)
    speculate = {"dflash2": "dflash"}.get(method, method)
    return Engine(target, kwargs.pop("drafter", None), speculate=speculate, **kwargs)


@pytest.fixture(scope="module")
def grammars():
    return Grammars(None, V, (0,), words=WORDS)


def _answer(engine: Engine, prompt, params, matcher) -> tuple[list[int], object]:
    engine.reset()
    tokens, finished = [], None
    for event in engine.generate(prompt, params, grammar=matcher):
        tokens += getattr(event, "token_ids", [])
        finished = event if hasattr(event, "reason") else finished
    return tokens, finished


def _watch_drafts(engine: Engine, seen: list) -> None:
    """After each held model draft: whether every draft is one the grammar allows where it stands (up to a
    drafted end), and each sampled q row's mass outside what the grammar allows there."""
    steps, draft = engine.steps, engine.steps.draft

    def watched(T, method="dflash", guide=None):
        draft(T, method, guide)
        if guide is None:
            return
        drafts = steps.ids[1:T].tolist()
        ended = 0 in drafts and drafts.index(0) + 1 == guide.walked
        outside = 0.0
        if steps.q is not None and not steps.params.greedy:
            allowed = allowed_tokens(guide.matcher.host[: guide.walked], V)
            outside = float((steps.q[: guide.walked] * ~allowed).sum())
            assert torch.allclose(steps.q[: guide.walked].sum(-1), torch.ones(guide.walked))
        seen.append((guide.walked == T - 1 or ended, outside))

    steps.draft = watched


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("method", METHODS)
def test_greedy_held_drafts_give_plain_constrained_decoding_token_for_token(method, folders, grammars):
    """Greedy constrained output under each method equals plain constrained decoding's; every model draft is one
    the grammar allows, and the drafts land (unheld, a random drafter's mostly break the grammar)."""
    plain, engine = _engine(folders, "none"), _engine(folders, method, draft="auto" if method == "auto" else 3)
    seen: list = []
    _watch_drafts(engine, seen)
    params = SamplingParams(max_new_tokens=14)
    accepted = 0
    for prompt in ([1, 4, 7], [3, 3, 9, 2, 11], [1, 9, 3, 1, 9, 3, 1]):
        constraint = Constraint("ebnf", LONG_GRAMMAR)
        want, _ = _answer(plain, prompt, params, grammars.matcher(constraint))
        got, finished = _answer(engine, prompt, params, grammars.matcher(constraint))
        assert got == want, method
        accepted += finished.stats.accepted
    assert accepted > 0
    if method != "lookup":
        assert seen and all(ok for ok, _ in seen), method


@pytest.mark.slow(seconds=8)
@pytest.mark.parametrize("method", ("dflash", "dflash2", "mtp"))
def test_sampled_held_drafts_keep_the_constrained_distribution(method, folders, grammars):
    """Tokens 1-3 of 300 seeded answers at T 0.7 with drafts drawn from the masked q against the exact marginals
    of plain constrained sampling; q never puts mass where the grammar refuses, and drafts are accepted. (With q
    taken from the unmasked logits, DFlash's and MTP's p is 1e-17 at 250 answers.)"""
    prompt = [1, 4, 7]
    params = SamplingParams(temperature=0.7, max_new_tokens=3)
    engine = _engine(folders, method)
    exact = _constrained_marginals(engine.target, grammars, prompt, params, steps=3)
    seen: list = []
    _watch_drafts(engine, seen)
    counts, accepted = torch.zeros(3, V), 0
    for i in range(300):
        matcher = grammars.matcher(Constraint("ebnf", TINY_GRAMMAR))
        tokens, finished = _answer(engine, prompt, SamplingParams(**{**vars(params), "seed": i}), matcher)
        accepted += finished.stats.accepted
        for pos, t in enumerate(tokens[:3]):
            counts[pos, t] += 1
    for pos in range(3):
        assert chi_square_p(counts[pos], exact[pos]) > P_MIN, f"token {pos + 1} is not the constrained distribution"
    assert accepted > 25
    assert all(ok and outside == 0.0 for ok, outside in seen)
