"""Branch prefix reuse: checkpoints along a prompt (engine/prefix_cache.py) let a prompt that shares only part of
the last one resume near where they differ, and what it answers is exactly what a cold prefill answers."""

import pytest
import torch

from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.prefix_cache import Checkpoint, CheckpointCache
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.conftest import ARCHS
from tests.engine.helpers import prefilled
from tests.engine.tiny import write_drafter, write_target

PARAMS = SamplingParams(max_new_tokens=24)  # greedy
SYSTEM = [(7 * i + 3) % 90 + 10 for i in range(30)]  # the shared "system block": 30 tokens


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(arch, drafter kind) -> (target dir, drafter dir); drafters with a sliding layer of window 8."""
    out = {}
    for i, arch in enumerate(ARCHS):
        for kind in ("dflash", "dflash2"):
            root = tmp_path_factory.mktemp(f"ckpt-{arch}-{kind}")
            write_target(root / "target", arch, seed=80 + i)
            write_drafter(root / "drafter", root / "target", seed=90 + i, block_size=8, dflash2=kind == "dflash2")
            out[arch, kind] = (root / "target", root / "drafter")
    return out


def _engine(dirs, **kwargs) -> Engine:
    target = load_target(dirs[0], "cpu", torch.float32)
    return Engine(target, load_drafter(dirs[1], target), max_context=256, draft=7, **kwargs)


def _answer(engine: Engine, prompt: list[int], marks=(), params=PARAMS) -> tuple[list[int], int, list[tuple[int, int]]]:
    """(tokens, reused tokens, (drafted, accepted) per step)."""
    tokens, steps, events = [], [], list(engine.generate(prompt, params, marks=marks))
    for event in events:
        if hasattr(event, "token_ids"):
            tokens.extend(event.token_ids)
            steps.append((event.drafted, event.accepted))
    return tokens, prefilled(events).reused_tokens, steps


def _prefilled_view(engine: Engine, prompt: list[int], marks) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
    """Prefill `prompt` (a one-token answer): (reused tokens, what the drafter drafts from the context it then
    holds, the GDN states)."""
    first, reused, _ = _answer(engine, prompt, marks, SamplingParams(max_new_tokens=1))
    drafted = engine.drafter.draft_hidden(first[0], len(prompt))
    return reused, drafted, [c.recurrent.clone() for c in engine.state.gdn_layers()]


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_branch_resumes_from_the_system_checkpoint_and_answers_as_a_cold_prefill(arch, kind, pairs):
    engine, cold = _engine(pairs[arch, kind]), _engine(pairs[arch, kind])
    first = SYSTEM + [11, 12, 13, 14, 15]
    branch = SYSTEM + [21, 22, 23, 24, 25, 26]
    _, reused, _ = _answer(engine, first, marks=[len(SYSTEM)])
    assert reused == 0
    # the prompt's first 30 tokens came from the checkpoint: the drafter's context (its sliding ring, whose rows
    # for positions before 30 the first answer overwrote) and the GDN state are the cold prefill's
    reused, drafted, states = _prefilled_view(engine, branch, [len(SYSTEM)])
    assert reused == len(SYSTEM)
    cold_reused, cold_drafted, cold_states = _prefilled_view(cold, branch, [len(SYSTEM)])
    assert cold_reused == 0
    torch.testing.assert_close(drafted, cold_drafted, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(states, cold_states, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    # and the answer, drafting on, greedy: token for token (the other engine answers the branch cold)
    other = _engine(pairs[arch, kind])
    _answer(engine, first, marks=[len(SYSTEM)])
    got, reused, steps = _answer(engine, branch, marks=[len(SYSTEM)])
    assert reused == len(SYSTEM)
    want, _, cold_steps = _answer(other, branch, marks=[len(SYSTEM)])
    assert got == want
    assert steps == cold_steps


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_checkpoints_every_n_tokens_serve_an_edited_tail(arch, pairs):
    engine, cold = _engine(pairs[arch, "dflash"], checkpoint_every=8), _engine(pairs[arch, "dflash"])
    first = SYSTEM + [11, 12, 13, 14, 15, 16, 17, 18, 19]
    _answer(engine, first)
    assert engine.checkpoints.lengths == [8, 16, 24, 32]
    edited = first[:27] + [40, 41, 42]  # differs from position 27 on: the checkpoint at 24 serves
    got, reused, _ = _answer(engine, edited)
    assert reused == 24
    assert engine.checkpoints.lengths == [8, 16, 24]  # the one at 32 held rows the edit overwrote
    assert got == _answer(cold, edited)[0]


def test_without_a_budget_a_hybrid_branch_prefills_from_scratch(pairs):
    engine = _engine(pairs["qwen3_5", "dflash"], checkpoint_budget=0)
    _answer(engine, SYSTEM + [11, 12], marks=[len(SYSTEM)])
    assert len(engine.checkpoints) == 0
    assert _answer(engine, SYSTEM + [21, 22], marks=[len(SYSTEM)])[1] == 0


def test_the_checkpoints_stay_under_the_budget_least_recently_used_first_out(pairs):
    probe = _engine(pairs["qwen3_5", "dflash"], checkpoint_every=8)
    _answer(probe, SYSTEM + [11, 12])
    size = probe.checkpoints.best(8).nbytes
    engine = _engine(pairs["qwen3_5", "dflash"], checkpoint_every=8, checkpoint_budget=2 * size)
    _answer(engine, SYSTEM + [11, 12], marks=[len(SYSTEM)])
    # positions 8, 16, 24 and the mark at 30: two fit; the marked one outlives the older unmarked ones
    assert engine.checkpoints.lengths == [24, 30]
    assert engine.checkpoints.evicted == 2
    assert engine.checkpoints.nbytes <= 2 * size
    assert _answer(engine, SYSTEM + [21, 22], marks=[len(SYSTEM)])[1] == len(SYSTEM)


def _checkpoint(length: int, nbytes: int, marked: bool = False) -> Checkpoint:
    return Checkpoint(length, [(torch.zeros(nbytes // 4), torch.zeros(0))], [], None, marked)


def test_cache_evicts_the_least_recently_used_and_refuses_what_cannot_fit():
    cache = CheckpointCache(300)
    for n in (10, 20, 30):
        assert cache.add(_checkpoint(n, 100))
    assert cache.best(25).length == 20  # used now: 10 is the least recently used
    assert cache.add(_checkpoint(40, 100))
    assert cache.lengths == [20, 30, 40]
    assert cache.evicted == 1
    assert not cache.add(_checkpoint(50, 400))  # over the whole budget: kept nowhere, nothing evicted
    assert cache.lengths == [20, 30, 40]
    assert cache.add(_checkpoint(5, 100, marked=True))
    assert cache.add(_checkpoint(60, 200))
    assert cache.lengths == [5, 60]  # unmarked ones go first, least recently used first
    cache.drop_past(5)
    assert cache.lengths == [5]
    with pytest.raises(ValueError, match="0 or more bytes"):
        CheckpointCache(-1)


def test_the_demo_pair_answers_a_branch_as_a_cold_prefill_does():
    """The shipped pair (a GDN hybrid target and its DFlash2 drafter), drafting on, greedy: the branch resumes at
    the checkpoint the chat template's system block ends at, and writes what a cold prefill writes."""
    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_available, demo_paths
    from dflash_chat.runtime.prompt import branch_marks, build_prompt

    if not demo_available():
        pytest.skip("the demo pair is not in dflash_chat/demo_data")
    pair = load_pair(*demo_paths(), device="cpu", max_context=2048, draft=7)  # fixed drafts: steps comparable
    cold = load_pair(*demo_paths(), device="cpu", max_context=2048, draft=7, checkpoint_budget=0).engine
    system = {"role": "system", "content": "You write Python. Keep answers short and exact. " * 40}

    def prompt(question: str) -> tuple[list[int], tuple[int, ...]]:
        ids = build_prompt(pair.tokenizer, [system, {"role": "user", "content": question}], thinking=False).ids
        return ids, branch_marks(pair.tokenizer, ids)

    params = SamplingParams(max_new_tokens=48)
    first, marks = prompt("How do I read a file line by line?")
    assert marks and marks[0] > 400
    _answer(pair.engine, first, marks, params)
    branch, marks = prompt("Write a function that reverses a string.")
    got, reused, steps = _answer(pair.engine, branch, marks, params)
    assert reused == marks[0]
    want, cold_reused, _ = _answer(cold, branch, marks, params)
    assert cold_reused == 0
    assert got == want
    assert sum(accepted for _, accepted in steps) > 0
    # the drafter's context and the GDN states are the cold prefill's, to float rounding: a resumed prefill runs
    # other matmul shapes than a whole one, so on trained weights a near-tie draft may flip between machines, and
    # the accepted counts per step are compared only on the tiny random pairs above
    _answer(pair.engine, first, marks, params)
    reused, drafted, states = _prefilled_view(pair.engine, branch, marks)
    assert reused == marks[0]
    _, cold_drafted, cold_states = _prefilled_view(cold, branch, marks)
    torch.testing.assert_close(drafted, cold_drafted, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(states, cold_states, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)  # the states are ~1e-3 in size


def test_a_device_without_room_for_a_checkpoint_answers_without_one(pairs, monkeypatch):
    engine, cold = _engine(pairs["qwen3_5", "dflash"], checkpoint_every=8), _engine(pairs["qwen3_5", "dflash"])
    _answer(engine, SYSTEM + [11, 12])
    assert engine.checkpoints.lengths == [8, 16, 24]

    real = engine._checkpoint

    def full(logits=None, marked=False):
        if logits is None:  # the cache's checkpoints; the prompt's end (the snapshot) is the engine's own memory
            raise torch.OutOfMemoryError("no room")
        return real(logits, marked)

    monkeypatch.setattr(engine, "_checkpoint", full)
    prompt = SYSTEM + [21, 22] + [23] * 12  # past 32: a new checkpoint is due, and there is no room for it
    got, reused, _ = _answer(engine, prompt)
    assert reused == 24 and len(engine.checkpoints) == 0
    assert got == _answer(cold, prompt)[0]


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3"])
def test_an_edit_after_an_earlier_turn_resumes_at_that_turns_prompt(arch, pairs):
    """A conversation's earlier prompt ends are kept: editing what followed one resumes there."""
    engine, cold = _engine(pairs[arch, "dflash"]), _engine(pairs[arch, "dflash"])
    turn1 = SYSTEM + [11, 12, 13]
    answer, _, _ = _answer(engine, turn1, marks=[len(SYSTEM)])
    turn2 = turn1 + answer + [21, 22]
    assert _answer(engine, turn2, marks=[len(SYSTEM)])[1] == len(turn1) + len(answer) - 1
    assert len(turn1) in engine.checkpoints.lengths  # turn 1's prompt end, with its logits
    edited = turn1 + [31, 32, 33]  # turn 1's answer replaced by hand
    got, reused, _ = _answer(engine, edited, marks=[len(SYSTEM)])
    assert reused == len(turn1)
    assert got == _answer(cold, edited)[0]
    again, reused, _ = _answer(engine, turn1, marks=[len(SYSTEM)])  # turn 1 again: its logits, no forward
    assert reused == len(turn1) and again == answer
