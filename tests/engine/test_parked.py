"""Parked conversations (engine/parked.py): two conversations at once, each with its own system prompt, each
resume where it left off when it comes back, and answer exactly what a cold prefill answers."""

import pytest
import torch

from dflash_chat.engine.load import load_drafter, load_mtp, load_target
from dflash_chat.engine.parked import Parked, Shelf, reusable
from dflash_chat.engine.prefix_cache import Checkpoint
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.conftest import ARCHS
from tests.engine.helpers import prefilled
from tests.engine.tiny import write_drafter, write_target

PARAMS = SamplingParams(max_new_tokens=12)  # greedy
A = [(7 * i + 3) % 90 + 10 for i in range(24)] + [11, 12, 13]  # one conversation: its system block and a question
B = [(5 * i + 1) % 80 + 20 for i in range(20)] + [14, 15]  # another, with another system block


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """arch -> (target dir, DFlash2 drafter dir with a sliding layer of window 8)."""
    out = {}
    for i, arch in enumerate(ARCHS):
        root = tmp_path_factory.mktemp(f"park-{arch}")
        write_target(root / "target", arch, seed=110 + i, mtp=arch != "qwen3")
        write_drafter(root / "drafter", root / "target", seed=120 + i, block_size=8, dflash2=True)
        out[arch] = (root / "target", root / "drafter")
    return out


def _engine(dirs, speculate="auto", **kwargs) -> Engine:
    target = load_target(dirs[0], "cpu", torch.float32)
    engine = Engine(
        target,
        load_drafter(dirs[1], target),
        mtp=load_mtp(dirs[0], target),
        max_context=256,
        draft=kwargs.pop("draft", 5),
        speculate=speculate,
        **kwargs,
    )
    engine.shelf.min_tokens = 8  # tiny conversations are worth parking here
    return engine


def _state(engine: Engine) -> list[torch.Tensor]:
    """Everything the engine holds of its conversation: the rows of its KV caches up to its tokens, the GDN
    states, the drafter's rings and the MTP layer's newest hidden state."""
    n = len(engine.tokens)
    held = [t[:n] for t in engine._row_caches()] + [t for pair in engine.state.save_recurrent() for t in pair]
    held += [t for ring in engine.drafter.save_rings() if ring is not None for t in ring]
    return held + ([engine.mtp.last] if engine.mtp is not None else [])


def _answer(engine: Engine, prompt: list[int]) -> tuple[list[int], int, list[tuple[str, int, int]]]:
    """(tokens, reused tokens, (method, drafted, accepted) per step)."""
    events = list(engine.generate(prompt, PARAMS))
    tokens = [t for e in events for t in getattr(e, "token_ids", [])]
    steps = [(e.method, e.drafted, e.accepted) for e in events if hasattr(e, "drafted")]
    return tokens, prefilled(events).reused_tokens, steps


@pytest.mark.parametrize("speculate", ["dflash", "mtp"])
@pytest.mark.parametrize("arch", ARCHS)
def test_two_conversations_at_once_each_resume_where_they_left_off(arch, speculate, pairs):
    """Each conversation's next turn, after the other one held the model, answers exactly as it does when
    nothing ran in between (the same tokens, the same drafts landing: the same state, bit for bit), and
    resumes all it held."""
    if speculate == "mtp" and arch == "qwen3":
        pytest.skip("the tiny qwen3 target carries no MTP layer")
    engine = _engine(pairs[arch], speculate)
    _answer(engine, A)
    held_a = list(engine.tokens)
    _, reused, _ = _answer(engine, B)  # B shares nothing with A: A is parked, not lost
    assert reused == 0 and len(engine.shelf) == 1
    held_b = list(engine.tokens)
    for prompt, held, next_turn in ((A, held_a, held_a + [50, 51]), (B, held_b, held_b + [60, 61])):
        got, reused, steps = _answer(engine, next_turn)
        assert reused == len(held) and len(engine.shelf) == 1  # it came back; the other went onto the shelf
        alone = _engine(pairs[arch], speculate)  # the same turns with nothing in between
        _answer(alone, prompt)
        assert _answer(alone, next_turn) == (got, reused, steps)
        assert engine.tokens == alone.tokens
        for mine, theirs in zip(_state(engine), _state(alone), strict=True):
            assert torch.equal(mine, theirs)
    cold, cold_reused, _ = _answer(_engine(pairs[arch], speculate), held_b + [60, 61])
    assert cold_reused == 0 and cold == got  # and greedy text is a cold prefill's


def test_a_parked_conversation_brings_back_its_checkpoints(pairs):
    """A's system block checkpoint goes onto the shelf with it: after B, a branch of A (same system block,
    another question) resumes at the block's end, as it does when nothing ran in between."""
    engine, alone = _engine(pairs["qwen3_5"], "dflash"), _engine(pairs["qwen3_5"], "dflash")
    branch = A[:24] + [70, 71, 72]
    list(engine.generate(A, PARAMS, marks=[24]))
    _answer(engine, B)
    got = _answer(engine, branch)
    assert got[1] == 24
    list(alone.generate(A, PARAMS, marks=[24]))
    assert _answer(alone, branch) == got


def test_the_next_turn_of_the_same_conversation_parks_nothing(pairs):
    """A turn that drops the last answer (as Qwen's template drops the last answer's thinking) resumes at the
    last prompt's end and parks no copy of what it drops; without a budget nothing is ever parked."""
    engine = _engine(pairs["qwen3_5"], "dflash")
    _answer(engine, A)
    _, reused, _ = _answer(engine, A + [80, 81, 82])
    assert reused == len(A) and len(engine.shelf) == 0
    off = _engine(pairs["qwen3_5"], "dflash", park_budget=0)
    _answer(off, A)
    held_a = list(off.tokens)
    _answer(off, B)
    assert len(off.shelf) == 0 and _answer(off, held_a + [50])[1] == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_the_same_prompt_sent_again_parks_no_copy_of_itself(arch, pairs):
    """A prompt sent again (a client retrying, a benchmark) resumes at its end-of-prompt snapshot: nothing is
    parked, the shelf's bytes stay flat however often it comes, and the conversation parked before it is still
    the one that comes back."""
    engine = _engine(pairs[arch], "dflash")
    _answer(engine, A)
    held_a = list(engine.tokens)
    first = _answer(engine, B)
    assert len(engine.shelf) == 1
    size = engine.shelf.nbytes
    for _ in range(6):
        again = _answer(engine, B)
        assert again[:2] == (first[0], len(B))  # the same answer, the whole prompt reused
        assert len(engine.shelf) == 1 and engine.shelf.nbytes == size and engine.shelf.evicted == 0
    assert _answer(engine, held_a + [50, 51])[1] == len(held_a)


def test_a_draft_change_keeps_the_conversations(pairs):
    """The draft setting changes neither the prompt nor the model: after it changes (the steps rebuilt, the step
    costs measured again for auto), the next turn reuses all the conversation held, a parked one still comes back,
    and the answers are a cold prefill's."""
    engine = _engine(pairs["qwen3_5"], "dflash")
    _answer(engine, B)
    held_b = list(engine.tokens)
    _answer(engine, A)  # B parked
    held_a = list(engine.tokens)
    for draft in ("auto", 3):
        engine.set_draft(draft)
        got, reused, _ = _answer(engine, held_a + [50, 51])
        assert reused == len(held_a) and len(engine.shelf) == 1
        cold, cold_reused, _ = _answer(_engine(pairs["qwen3_5"], "dflash", draft=draft), held_a + [50, 51])
        assert cold_reused == 0 and cold == got
        held_a = list(engine.tokens)
    assert _answer(engine, held_b + [60])[1] == len(held_b)


def test_a_speculate_change_keeps_the_conversation(pairs):
    """Which method drafts changes neither the prompt nor the model either: the next turn after a change to the MTP
    layer and back reuses all the conversation held, and answers as a cold prefill does."""
    engine = _engine(pairs["qwen3_5"], "dflash")
    _answer(engine, A)
    for speculate in ("mtp", "dflash"):
        held = list(engine.tokens)
        engine.set_speculate(speculate)
        got, reused, _ = _answer(engine, held + [50])
        assert reused == len(held)
        assert _answer(_engine(pairs["qwen3_5"], speculate), held + [50])[0] == got


def _parked(tokens: list[int], nbytes: int, checkpoints=()) -> Parked:
    end = Checkpoint(len(tokens), [], [])
    return Parked(tokens, [torch.zeros(nbytes // 4)], end, [Checkpoint(n, [], []) for n in checkpoints])


def test_the_shelf_keeps_the_newest_under_its_budget_and_gives_back_the_best_match():
    shelf = Shelf(300, min_tokens=4)
    one, two, three = _parked([1] * 10, 100), _parked([2] * 10, 100, checkpoints=[5]), _parked([3] * 10, 100)
    for parked in (one, two, three):
        assert shelf.add(parked)
    assert shelf.add(_parked([4] * 10, 100)) and shelf.evicted == 1 and len(shelf) == 3  # `one` went
    assert shelf.take([1] * 12, better_than=0) is None
    assert not shelf.add(_parked([5] * 10, 400))  # over the whole budget: not kept, nothing evicted
    assert shelf.take([2] * 7 + [9], better_than=5) is None  # its checkpoint at 5 is no better than 5
    assert shelf.take([2] * 7 + [9], better_than=0) is two and len(shelf) == 2  # taken off the shelf
    assert shelf.take([3] * 2, better_than=0) is None  # fewer than min_tokens shared
    assert shelf.take([3] * 10 + [1], better_than=0) is three  # it extends all three holds
    with pytest.raises(ValueError, match="0 or more bytes"):
        Shelf(-1)


def test_what_a_state_can_serve_of_a_prompt():
    held = [1, 2, 3, 4, 5, 6]
    assert reusable(held, [2, 4], held + [7]) == 6  # it extends the held tokens
    assert reusable(held, [2, 4], [1, 2, 3, 4, 5, 9]) == 4  # it branches at 5: the checkpoint at 4
    assert reusable(held, [2, 4], [1, 2, 3, 4, 5, 9], any_length=True) == 5  # attention-only: truncate at 5
    assert reusable(held, [2, 4, 6], held) == 4  # the same prompt, with no logits kept: the last token runs again
    assert reusable(held, [2, 4, 6], held, ends=[6]) == 6  # its end-of-prompt snapshot: nothing runs
    assert reusable(held, [2, 4], held[:4], ends=[4]) == 4  # an earlier prompt of this conversation, sent again
    assert reusable(held, [2, 4], held[:5], ends=[4]) == 4  # one that ended elsewhere: no logits at 5
    assert reusable(held, [2, 4], [9]) == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_a_parked_token_costs_what_doctor_counts(arch, pairs):
    """memory.row_bytes (doctor's figure for the `prefix_cache_ram_mib` budget) is what a parked conversation's
    rows take a token, in the target's KV, the drafter's full layers and the MTP layer's KV."""
    from dflash_chat.engine.memory import DrafterShape, TargetShape, row_bytes

    engine = _engine(pairs[arch], "dflash")
    _answer(engine, A)
    held = len(engine.tokens)
    _answer(engine, B)
    (parked,) = engine.shelf._parked
    assert len(parked.tokens) == held
    rows = sum(t.numel() * t.element_size() for t in parked.rows)
    shapes = TargetShape.of(engine.target.cfg), DrafterShape.of(engine.drafter.cfg)
    assert rows == held * row_bytes(*shapes, 4) and all(t.device.type == "cpu" for t in parked.rows)
