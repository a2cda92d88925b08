"""The fixed-shape decode path (device-resident positions, always a B-token verify; captured as CUDA graphs
on a GPU) gives the eager path's tokens and acceptance, and its steps read nothing from the device."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from dflash_chat.engine.events import Finished, Step
from dflash_chat.engine.load import load_drafter, load_pair, load_target
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.oracle import OracleDrafter
from dflash_chat.engine.sampling import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.conftest import ARCHS
from tests.engine.helpers import prefilled, run
from tests.engine.sync_free import HostRead, NoHostReads


def _prompts(vocab, n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 30))] for _ in range(n)]


def _pair(tiny_dirs, arch, decode):
    target_dir, drafter_dir, _ = tiny_dirs[arch]
    target = load_target(target_dir, "cpu", torch.float32)
    return Engine(target, load_drafter(drafter_dir, target), max_context=200, decode=decode)


def _same_run(a, b, prompt, params):
    got_a, fin_a, _ = run(a, prompt, params)
    got_b, fin_b, _ = run(b, prompt, params)
    assert got_a == got_b
    sa, sb = fin_a.stats, fin_b.stats
    assert fin_a.reason == fin_b.reason
    assert (sa.acceptance_histogram, sa.drafted, sa.accepted, sa.steps) == (
        sb.acceptance_histogram, sb.drafted, sb.accepted, sb.steps)
    return got_a, fin_a


def test_the_modes_resolve_per_device():
    from dflash_chat.engine.spec import decode_mode

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decode_mode("auto", cpu) == "eager" and decode_mode("auto", cuda) == "graphs"
    assert decode_mode("graphs", cpu) == "fixed"  # graphs need CUDA; the same steps run uncaptured
    with pytest.raises(ValueError):
        decode_mode("fast", cpu)


@pytest.mark.parametrize("arch", ARCHS)
def test_fixed_steps_give_the_eager_tokens_and_acceptance(arch, tiny_dirs):
    eager, fixed = _pair(tiny_dirs, arch, "eager"), _pair(tiny_dirs, arch, "fixed")
    assert fixed.decode == "fixed" and fixed.fixed is not None
    vocab = eager.target.cfg.vocab_size
    # 37 and 5 new tokens end inside a block: the fixed verify pads, the eager one shrinks
    for prompt, n in zip(_prompts(vocab, 3, seed=3), (37, 5, 60)):
        _same_run(eager, fixed, prompt, SamplingParams(max_new_tokens=n))


@pytest.mark.parametrize("arch", ARCHS)
def test_fixed_steps_are_lossless_at_every_acceptance_length(arch, tiny_dirs):
    target = load_target(tiny_dirs[arch][0], "cpu", torch.float32)
    vocab = target.cfg.vocab_size
    ar = Engine(target, None, max_context=160)
    ar_fixed = Engine(target, None, max_context=160, decode="fixed")
    lengths = set()
    for i, prompt in enumerate(_prompts(vocab, 8, seed=11)):
        params = SamplingParams(max_new_tokens=40)
        expected, _ = _same_run(ar, ar_fixed, prompt, params)
        ar.reset()
        ar_fixed.reset()
        oracle = OracleDrafter(prompt + expected, vocab, mode="uniform", seed=i)
        eager_oracle = OracleDrafter(prompt + expected, vocab, mode="uniform", seed=i)
        got, finished = _same_run(Engine(target, eager_oracle, max_context=160),
                                  Engine(target, oracle, max_context=160, decode="fixed"), prompt, params)
        assert got == expected
        lengths |= {k for k, c in enumerate(finished.stats.acceptance_histogram) if c}
    assert len(lengths) >= 10, f"acceptance lengths seen: {sorted(lengths)}"


def test_fixed_steps_on_the_demo_pair():
    pytest.importorskip("tokenizers")
    from dflash_chat.demo import demo_available, demo_paths

    if not demo_available():
        pytest.skip("this install has no demo pair")
    target_dir, drafter_dir = demo_paths()
    eager = load_pair(target_dir, drafter_dir, device="cpu", max_context=512)
    fixed = load_pair(target_dir, drafter_dir, device="cpu", max_context=512, decode="fixed")
    from dflash_chat.chat.prompt import build_prompt
    from dflash_chat.train.evaluate import demo_heldout_prompts

    accepted = steps = 0
    for messages in demo_heldout_prompts()[:3]:
        prompt = build_prompt(eager.tokenizer, messages, thinking=False).ids
        _, finished = _same_run(eager.engine, fixed.engine, prompt, SamplingParams(max_new_tokens=45))
        accepted, steps = accepted + finished.stats.accepted, steps + finished.stats.steps
    assert accepted > 2 * steps  # the trained drafter: its taps and context work on the fixed path too


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_reuse_across_turns_on_fixed_steps(arch, tiny_dirs):
    eager, fixed = _pair(tiny_dirs, arch, "eager"), _pair(tiny_dirs, arch, "fixed")
    params = SamplingParams(max_new_tokens=21)
    turn1 = [11, 12, 13, 14, 15, 16]
    answer, _ = _same_run(eager, fixed, turn1, params)
    turn2 = turn1 + answer + [21, 22, 23]
    _, _, events = run(fixed, turn2, params)
    assert prefilled(events).reused_tokens == len(turn1) + len(answer) - 1
    eager.reset()
    fresh, _, _ = run(eager, turn2, params)
    fixed.reset()
    assert run(fixed, turn2, params)[0] == fresh


@pytest.mark.parametrize("causal, layers", [(None, [True, False]), (False, [False, False])])
@torch.no_grad()
def test_fixed_shape_drafts_are_the_eager_drafts(tiny_dirs, causal, layers):
    """The tiny drafter's sliding layer (window 8 < block 16, a ring of 24 cache rows) causal as the checkpoint
    leaves it, or bidirectional: draft_block (device positions, whole caches read under a length mask) drafts
    what propose drafts, before the ring wraps (the eager step reads plain rows) and after."""
    target_dir, drafter_dir, _ = tiny_dirs["qwen3"]
    target = load_target(target_dir, "cpu", torch.float32)
    eager, fixed = (load_drafter(drafter_dir, target, causal=causal) for _ in range(2))
    assert [layer.self_attn.causal for layer in fixed.layers] == layers
    rows = 64
    eager.allocate(rows)
    fixed.allocate(rows)
    features = torch.randn(50, 2 * target.cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    block = fixed.block_ids(torch.device("cpu"))
    offsets = torch.arange(fixed.block_size)
    for start, end in ((0, 5), (5, 13), (13, 14), (14, 31), (31, 40)):
        eager.append_context(features[start:end], end)
        fixed.store_context(features[start:end], torch.arange(start, end))
        block[0] = end % 50
        got = fixed.draft_block(block, Span.fixed(torch.tensor(end), offsets, rows))
        assert torch.equal(got, eager.propose(end % 50, end)[1:])


def test_cancel_and_stop_on_fixed_steps(tiny_dirs):
    eager, fixed = _pair(tiny_dirs, "qwen3_5", "eager"), _pair(tiny_dirs, "qwen3_5", "fixed")
    prompt = [1, 2, 3, 4]
    full, _, _ = run(eager, prompt, SamplingParams(max_new_tokens=40))
    eager.reset()
    # a stop token inside a block ends the answer there, on both paths
    stop = full[17]
    params = SamplingParams(max_new_tokens=40, stop_token_ids=(stop,))
    got, finished = _same_run(eager, fixed, prompt, params)
    assert got == full[: full.index(stop) + 1] and finished.reason == "stop"
    # cancelling keeps what was produced and leaves a state the next turn reuses
    fixed.reset()
    cancel, produced = threading.Event(), []
    for event in fixed.generate(prompt, SamplingParams(max_new_tokens=40), cancel):
        if isinstance(event, Step):
            produced.extend(event.token_ids)
            cancel.set()
        elif isinstance(event, Finished):
            assert event.reason == "cancelled"
    assert produced == full[: len(produced)]
    nxt = prompt + produced + [9]
    _, _, events = run(fixed, nxt, SamplingParams(max_new_tokens=5))
    assert prefilled(events).reused_tokens == len(prompt) + len(produced) - 1


def test_seeded_sampling_on_fixed_steps_is_reproducible(tiny_dirs):
    fixed = _pair(tiny_dirs, "qwen3_5", "fixed")
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, max_new_tokens=30, seed=7)
    first, _, _ = run(fixed, [3, 4, 5], params)
    fixed.reset()
    assert run(fixed, [3, 4, 5], params)[0] == first


def test_the_host_read_check_can_fail():
    t = torch.arange(4)
    for read in (lambda: t.tolist(), lambda: t[1].item(), lambda: int(t[2]), lambda: t.nonzero(),
                 lambda: t[t > 1], lambda: bool(t.sum() > 0)):
        with pytest.raises(HostRead), NoHostReads():
            read()
    with NoHostReads():
        torch.where(t > 1, t, 0).cumsum(0).argmax()  # device-side logic is fine


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("sampling", [False, True])
def test_step_entry_points_read_nothing_from_the_device(arch, sampling, tiny_dirs):
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=1) if sampling else SamplingParams()
    for drafted in (True, False):
        engine = _pair(tiny_dirs, arch, "fixed")
        if not drafted:
            engine = Engine(engine.target, None, max_context=200, decode="fixed")
        run(engine, [5, 6, 7, 8], SamplingParams(max_new_tokens=3))  # a prefill and a few steps first
        steps = engine.fixed
        steps.begin(engine.tokens and 3, params, torch.Generator().manual_seed(0))
        steps.remaining.fill_(10)
        if sampling:
            steps.draws.fill(steps.generator)
        names = ["decode"] if not drafted else ["draft", "verify"]
        start = steps.start.clone()
        with NoHostReads():  # raises on any read of a device value
            for name in names + [steps._accept_key(), "commit"]:
                steps._run(name)
        assert steps.start.item() > start.item()  # the step really ran: at least one token committed


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_give_the_eager_tokens(arch, dtype, tiny_dirs):
    """On the GPU: the captured steps, the same steps uncaptured, and eager steps agree (fp32: token for
    token; bf16: token for token too, as every path runs the same kernels on the same shapes per step)."""
    target_dir, drafter_dir, _ = tiny_dirs[arch]
    target = load_target(target_dir, "cuda", dtype)
    engines = {mode: Engine(target, load_drafter(drafter_dir, target), max_context=200, decode=mode)
               for mode in ("graphs", "fixed")}
    assert engines["graphs"].decode == "graphs", "capture failed (see the warning)"
    ar = Engine(target, None, max_context=200, decode="graphs")
    assert ar.decode == "graphs"
    ar_eager = Engine(target, None, max_context=200, decode="eager")
    for prompt, n in zip(_prompts(target.cfg.vocab_size, 3, seed=5), (37, 16, 50)):
        params = SamplingParams(max_new_tokens=n)
        _same_run(engines["graphs"], engines["fixed"], prompt, params)
        expected, _ = _same_run(ar, ar_eager, prompt, params)
        if dtype == torch.float32:
            assert run(engines["graphs"], prompt, params)[0] == expected


@cuda
@pytest.mark.gpu
def test_cuda_graphs_sample_on_the_device(tiny_dirs):
    target = load_target(tiny_dirs["qwen3_5"][0], "cuda", torch.bfloat16)
    engine = Engine(target, load_drafter(tiny_dirs["qwen3_5"][1], target), max_context=200, decode="graphs")
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=40, seed=3)
    first, finished, _ = run(engine, [3, 4, 5], params)
    assert finished.reason == "length" and len(first) == 40
    engine.reset()
    assert run(engine, [3, 4, 5], params)[0] == first
    assert ("accept", 0.8, 20, 0.9) in engine.fixed.graphs  # captured for this setting
