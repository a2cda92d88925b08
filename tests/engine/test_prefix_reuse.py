"""Multi-turn prefix reuse: only the new suffix is prefilled, and the output is unchanged."""

import pytest
import torch

from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.conftest import ARCHS
from tests.engine.helpers import prefilled, run

PARAMS = SamplingParams(max_new_tokens=20)


def _engines(tiny_dirs, arch):
    target_dir, drafter_dir, _ = tiny_dirs[arch]
    target = load_target(target_dir, "cpu", torch.float32)
    drafter = load_drafter(drafter_dir, target)
    return Engine(target, drafter, max_context=256), Engine(target, load_drafter(drafter_dir, target), max_context=256)


@pytest.mark.parametrize("arch", ARCHS)
def test_next_turn_prefills_only_the_suffix(arch, tiny_dirs):
    engine, fresh = _engines(tiny_dirs, arch)
    turn1 = [11, 12, 13, 14, 15, 16]
    answer, _, events = run(engine, turn1, PARAMS)
    assert prefilled(events).reused_tokens == 0
    # the next prompt holds the whole first turn (answer included) and a new user message
    turn2 = turn1 + answer + [21, 22, 23]
    second, _, events = run(engine, turn2, PARAMS)
    # the answer's last token was never run through the target, everything before it was
    assert prefilled(events).reused_tokens == len(turn1) + len(answer) - 1
    expected, _, _ = run(fresh, turn2, PARAMS)
    assert second == expected


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_that_diverges_after_the_last_prompt_restarts_from_the_snapshot(arch, tiny_dirs):
    """A chat template that re-renders the previous answer differently (e.g. without its thinking)."""
    engine, fresh = _engines(tiny_dirs, arch)
    turn1 = [31, 32, 33, 34, 35]
    answer, _, _ = run(engine, turn1, PARAMS)
    turn2 = turn1 + [7, 7] + [41, 42]
    second, _, events = run(engine, turn2, PARAMS)
    assert prefilled(events).reused_tokens == len(turn1)
    assert second == run(fresh, turn2, PARAMS)[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_regenerating_the_same_prompt_reuses_all_of_it(arch, tiny_dirs):
    engine, _ = _engines(tiny_dirs, arch)
    prompt = [51, 52, 53, 54]
    first, _, _ = run(engine, prompt, PARAMS)
    again, _, events = run(engine, prompt, PARAMS)
    assert prefilled(events).reused_tokens == len(prompt)
    assert again == first


@pytest.mark.parametrize("arch", ARCHS)
def test_unrelated_prompt_falls_back_to_a_full_prefill(arch, tiny_dirs):
    engine, fresh = _engines(tiny_dirs, arch)
    run(engine, [61, 62, 63, 64], PARAMS)
    other = [61, 99, 98, 97, 96]
    got, _, events = run(engine, other, PARAMS)
    reused = prefilled(events).reused_tokens
    # hybrid targets restart; an attention-only one could keep the shared first token, but the drafter's
    # sliding ring (window 8) no longer holds the rows before it, 24 tokens later: it refills from 0
    assert reused == 0
    assert got == run(fresh, other, PARAMS)[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_that_diverges_inside_the_last_answer_keeps_what_it_can(arch, tiny_dirs):
    """The template re-renders the previous answer, differing after its first 3 tokens: both restart from the
    prompt's snapshot (a hybrid target's state cannot be truncated; an attention-only one's can, but its
    drafter's sliding ring must be refilled from a window (8) before the difference, before the snapshot)."""
    engine, fresh = _engines(tiny_dirs, arch)
    turn1 = [31, 32, 33, 34, 35]
    answer, _, _ = run(engine, turn1, PARAMS)
    other = next(t for t in (7, 8) if t != answer[3])
    turn2 = turn1 + answer[:3] + [other, 41, 42]
    second, _, events = run(engine, turn2, PARAMS)
    assert prefilled(events).reused_tokens == len(turn1)
    assert second == run(fresh, turn2, PARAMS)[0]
