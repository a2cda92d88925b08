"""The decode steps (steps/: device-resident positions, fixed shapes, captured as CUDA graphs on a GPU) give
plain decoding's tokens at every draft setting, and their entry points read nothing from the device."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from dflash_chat.bench.oracle import OracleDrafter
from dflash_chat.engine.events import Finished, Step
from dflash_chat.engine.load import load_drafter, load_mtp, load_pair, load_target
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from dflash_chat.engine.steps.decode import Steps
from tests.engine.conftest import ARCHS
from tests.engine.helpers import full_and_short_drafts, prefilled, run
from tests.engine.sync_free import HostRead, NoHostReads

DRAFTS = ("off", 1, 7, 15, "auto")


def _prompts(vocab, n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 30))] for _ in range(n)]


def _pair(tiny_dirs, arch, decode="auto", draft="auto", speculate="dflash"):
    target_dir, drafter_dir, _ = tiny_dirs[arch]
    target = load_target(target_dir, "cpu", torch.float32)
    drafter = load_drafter(drafter_dir, target)
    return Engine(target, drafter, max_context=200, decode=decode, draft=draft, speculate=speculate)


def test_the_modes_resolve_per_device():
    from dflash_chat.engine.spec import decode_mode

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decode_mode("auto", cpu) == "fixed" and decode_mode("auto", cuda) == "graphs"
    assert decode_mode("graphs", cpu) == "fixed"  # graphs need CUDA; the same steps run uncaptured
    assert decode_mode("eager", cpu) == "fixed"  # the older name of uncaptured steps
    with pytest.raises(ValueError, match="decode must be one of"):
        decode_mode("fast", cpu)


def test_the_draft_setting_is_checked_and_sized():
    from dflash_chat.engine.draft_length import parse_draft, verify_sizes

    assert [parse_draft(v) for v in ("auto", "OFF", " 7 ", 3)] == ["auto", "off", 7, 3]
    for bad in ("0", "-2", "fast", "1.5", True):
        with pytest.raises(ValueError, match="draft must be auto, off or a number"):
            parse_draft(bad)
    assert verify_sizes("auto", 16) == [1, 4, 8, 16] and verify_sizes("auto", 8) == [1, 4, 8]
    assert verify_sizes(40, 16) == [16] and verify_sizes(3, 16) == [4] and verify_sizes("off", 16) == [1]


@pytest.mark.slow(seconds=6)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_drafting_gives_plain_decodings_tokens_at_every_draft_setting(arch, tiny_dirs):
    target = load_target(tiny_dirs[arch][0], "cpu", torch.float32)
    plain = Engine(target, None, max_context=200)
    vocab = target.cfg.vocab_size
    prompts = list(zip(_prompts(vocab, 3, seed=3), (37, 5, 60), strict=True))  # 37 and 5 end inside a block
    expected = [run(plain, prompt, SamplingParams(max_new_tokens=n))[0] for prompt, n in prompts]
    for draft in DRAFTS:
        engine = Engine(target, load_drafter(tiny_dirs[arch][1], target), max_context=200, draft=draft)
        for (prompt, n), want in zip(prompts, expected, strict=True):
            got, finished, _ = run(engine, prompt, SamplingParams(max_new_tokens=n))
            assert got == want, f"draft {draft}"
            s = finished.stats
            assert s.draft == str(draft) and s.new_tokens == n and sum(s.draft_histogram) == s.steps
            if draft == "off":
                assert s.drafted == 0 and s.steps == n - 1


@pytest.mark.parametrize("arch", ARCHS)
def test_every_acceptance_length_is_lossless(arch, tiny_dirs):
    target = load_target(tiny_dirs[arch][0], "cpu", torch.float32)
    vocab = target.cfg.vocab_size
    plain = Engine(target, None, max_context=160)
    lengths = set()
    for i, prompt in enumerate(_prompts(vocab, 8, seed=11)):
        params = SamplingParams(max_new_tokens=40)
        expected, _, _ = run(plain, prompt, params)
        oracle = OracleDrafter(prompt + expected, vocab, mode="uniform", seed=i)
        got, finished, _ = run(Engine(target, oracle, max_context=160, draft=15), prompt, params)
        assert got == expected
        lengths |= {k for k, c in enumerate(finished.stats.acceptance_histogram) if c}
    assert len(lengths) >= 10, f"acceptance lengths seen: {sorted(lengths)}"


@pytest.mark.slow(seconds=9)
def test_the_demo_pair_drafts_losslessly_at_every_draft_setting():
    pytest.importorskip("tokenizers")
    from dflash_chat.models.demo import demo_available, demo_paths

    if not demo_available():
        pytest.skip("this install has no demo pair")
    from dflash_chat.models.demo import demo_heldout_prompts
    from dflash_chat.runtime.prompt import build_prompt

    target_dir, drafter_dir = demo_paths()
    plain = load_pair(target_dir, None, device="cpu", max_context=512)
    every_row = load_pair(target_dir, drafter_dir, device="cpu", max_context=512, draft=15).engine
    every_row.steps.static = True  # read every cache row, under the length mask, as a captured step does
    prompts = [build_prompt(plain.tokenizer, m, thinking=False).ids for m in demo_heldout_prompts()[:3]]
    params = SamplingParams(max_new_tokens=45)
    for draft in (15, "auto"):
        spec = load_pair(target_dir, drafter_dir, device="cpu", max_context=512, draft=draft)
        accepted = steps = 0
        for prompt in prompts:
            got, finished, _ = run(spec.engine, prompt, params)
            assert got == run(plain.engine, prompt, params)[0]
            accepted, steps = accepted + finished.stats.accepted, steps + finished.stats.steps
            if draft == 15:  # uncaptured steps read fewer rows, never fewer that matter: the same drafts
                reference = run(every_row, prompt, params)[1].stats
                assert finished.stats.acceptance_histogram == reference.acceptance_histogram
        assert accepted > 2 * steps  # the trained drafter's taps and context work on these steps


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_reuse_across_turns(arch, tiny_dirs):
    engine = _pair(tiny_dirs, arch)
    params = SamplingParams(max_new_tokens=21)
    turn1 = [11, 12, 13, 14, 15, 16]
    answer, _, _ = run(engine, turn1, params)
    turn2 = turn1 + answer + [21, 22, 23]
    continued, _, events = run(engine, turn2, params)
    assert prefilled(events).reused_tokens == len(turn1) + len(answer) - 1
    engine.reset()
    assert run(engine, turn2, params)[0] == continued


def test_a_conversation_keeps_one_acceptance_estimate_for_greedy_answers_and_one_for_sampled(tiny_dirs):
    """Greedy drafts land far more often than sampled ones: a greedy answer after sampled ones in the same
    conversation starts from the greedy prior, and leaves the sampled answers' estimate as it was. The
    engine keeps none of it: the memory is the caller's."""
    from dflash_chat.engine.draft_length import PRIOR_GREEDY, PRIOR_SAMPLED, DraftMemory

    engine = _pair(tiny_dirs, "qwen3_5")
    memory = DraftMemory()
    sampled = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, max_new_tokens=12, seed=3)
    for _ in engine.generate([3, 4, 5], sampled, memory=memory):
        pass
    kept = memory.estimates["dflash", False]
    counts = (list(kept.tries), list(kept.hits))
    assert kept.prior == PRIOR_SAMPLED and sum(kept.tries) > 0 and ("dflash", True) not in memory.estimates
    events = list(engine.generate([3, 4, 5, 6], SamplingParams(max_new_tokens=12), memory=memory))
    greedy = memory.estimates["dflash", True]
    assert greedy.prior == PRIOR_GREEDY > PRIOR_SAMPLED and sum(greedy.tries) > 0
    assert memory.estimates["dflash", False] is kept and (kept.tries, kept.hits) == counts
    assert isinstance(events[-1], Finished)
    assert not {"acceptance", "records"} & set(vars(engine))  # nothing of a conversation stays in the engine


def test_a_new_conversation_starts_from_what_the_drafters_earlier_answers_measured(tiny_dirs):
    """Each decoding's record learns the share of an answer's drafting steps whose first draft landed; a new
    conversation's estimate starts from it, one that goes on keeps its own, and the other decoding's record
    is left as it was."""
    from dflash_chat.engine.draft_length import PRIOR_GREEDY, PRIOR_SAMPLED, RECORD_PRIOR, DraftMemory, Records

    engine = _pair(tiny_dirs, "qwen3_5")
    records = Records()
    a, b = DraftMemory(records), DraftMemory(records)
    sampled = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, max_new_tokens=16, seed=5)
    finished = [e for e in engine.generate([3, 4, 5], sampled, memory=a) if isinstance(e, Finished)][0]
    histogram = finished.stats.acceptance_histogram
    share = (sum(histogram) - histogram[0]) / sum(histogram)
    record = records.of(greedy=False)
    assert record.answers == 1.0 and record.landed == pytest.approx(share)
    assert record.prior() == pytest.approx((share + PRIOR_SAMPLED * RECORD_PRIOR) / (1 + RECORD_PRIOR))
    assert records.of(greedy=True).answers == 0 and records.of(greedy=True).prior() == PRIOR_GREEDY
    start = record.prior()
    list(engine.generate([3, 4, 5, 6], sampled, memory=b))
    assert b.estimates["dflash", False].prior == start and record.answers == pytest.approx(1.7)
    list(engine.generate([3, 4, 5, 6, 7], sampled, memory=a))
    assert a.estimates["dflash", False].prior == PRIOR_SAMPLED  # a conversation that goes on keeps its own

    fixed = _pair(tiny_dirs, "qwen3_5", draft=15)  # fixed drafts teach how drafts land too
    kept = Records()
    list(fixed.generate([3, 4, 5], sampled, memory=DraftMemory(kept)))
    assert kept.of(greedy=False).answers == 1.0


@pytest.mark.parametrize("causal, layers", [(None, [True, False]), (False, [False, False])])
@torch.no_grad()
def test_captured_shape_drafts_are_the_eager_views_drafts(tiny_dirs, causal, layers):
    """The tiny drafter's sliding layer (window 8 < block 16, a ring of 24 cache rows) causal as the checkpoint
    leaves it, or bidirectional: draft_logits over every allocated row under a length mask (what a captured step
    reads) drafts what the eager view drafts, before the ring wraps (plain rows) and after."""
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
        got = fixed.draft_logits(block, Span.fixed(torch.tensor(end), offsets, rows)).argmax(-1)
        assert torch.equal(got, eager.logits(eager.draft_hidden(end % 50, end)).argmax(-1))


@torch.no_grad()
def test_plain_steps_store_the_drafters_context_by_the_next_draft(tiny_dirs):
    """Uncaptured plain steps defer the drafter's context to the next draft (one store for the run): the drafts
    after a run of plain steps, one longer than the sliding layer's ring, are those of steps that stored each
    row at once (as captured steps do)."""
    drafts = []
    for static in (False, True):
        engine = _pair(tiny_dirs, "qwen3_5", draft="auto")
        steps = engine.steps
        steps.static = static
        prompt = [3, 1, 4, 1, 5, 9, 2, 6]
        steps.prefill(prompt, final=True)
        steps.begin(7, len(prompt), SamplingParams(), None)
        for _ in range(30):  # a ring of 24 rows: the deferred run wraps it
            steps.verify(1, 100)
            steps.commit(1)
            steps.read()
        assert bool(steps.deferred) != static
        steps.draft(steps.B)
        drafts.append(steps.ids.clone())
    assert torch.equal(*drafts)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_draft_for_a_short_verify_is_the_full_drafts_prefix(tiny_dirs, sampled):
    """The block runs whole either way: its first T - 1 drafts (and, sampled, their q rows) are the same."""
    (full, full_q), (short, short_q) = full_and_short_drafts(_pair(tiny_dirs, "qwen3_5", draft="auto"), sampled)
    assert torch.equal(short, full)
    if sampled:  # the same q rows, to the last bits a smaller matrix product may round differently
        torch.testing.assert_close(short_q, full_q, rtol=1e-5, atol=1e-7)
        assert bool((short_q.sum(-1) > 0.99).all())


def test_cancel_and_stop(tiny_dirs):
    engine = _pair(tiny_dirs, "qwen3_5", draft=15)
    prompt = [1, 2, 3, 4]
    full, _, _ = run(engine, prompt, SamplingParams(max_new_tokens=40))
    # a stop token inside a block ends the answer there
    stop = full[17]
    got, finished, _ = run(engine, prompt, SamplingParams(max_new_tokens=40, stop_token_ids=(stop,)))
    assert got == full[: full.index(stop) + 1] and finished.reason == "stop"
    # cancelling keeps what was produced and leaves a state the next turn reuses
    engine.reset()
    cancel, produced = threading.Event(), []
    for event in engine.generate(prompt, SamplingParams(max_new_tokens=40), cancel):
        if isinstance(event, Step):
            produced.extend(event.token_ids)
            cancel.set()
        elif isinstance(event, Finished):
            assert event.reason == "cancelled"
    assert produced == full[: len(produced)]
    nxt = prompt + produced + [9]
    _, _, events = run(engine, nxt, SamplingParams(max_new_tokens=5))
    assert prefilled(events).reused_tokens == len(prompt) + len(produced) - 1


@pytest.mark.parametrize("draft", [15, 3])
def test_seeded_sampling_is_reproducible(draft, tiny_dirs):
    """For a fixed draft setting (auto's choices follow the timings, and with them the draws)."""
    engine = _pair(tiny_dirs, "qwen3_5", draft=draft)
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, max_new_tokens=30, seed=7)
    first, _, _ = run(engine, [3, 4, 5], params)
    engine.reset()
    assert run(engine, [3, 4, 5], params)[0] == first


def test_the_host_read_check_can_fail():
    t = torch.arange(4)
    for read in (
        lambda: t.tolist(),
        lambda: t[1].item(),
        lambda: int(t[2]),
        lambda: t.nonzero(),
        lambda: t[t > 1],
        lambda: bool(t.sum() > 0),
    ):
        with pytest.raises(HostRead), NoHostReads():
            read()
    with NoHostReads():
        torch.where(t > 1, t, 0).cumsum(0).argmax()  # device-side logic is fine


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("sampling", [False, True])
def test_step_entry_points_read_nothing_from_the_device(arch, sampling, tiny_dirs, mtp_dirs):
    """Every method's draft (DFlash, the MTP layer, lookup's placed drafts), verify and commit at every size."""
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=1) if sampling else SamplingParams()
    drafted = _pair(tiny_dirs, arch, speculate="auto")
    engines = [drafted, Engine(drafted.target, None, max_context=200, speculate="none")]
    if arch in mtp_dirs:
        target = load_target(mtp_dirs[arch][0], "cpu", torch.float32)
        engines.append(Engine(target, None, mtp=load_mtp(mtp_dirs[arch][0], target), max_context=200))
    for engine in engines:
        run(engine, [5, 6, 7, 8], SamplingParams(max_new_tokens=3))  # a prefill and a few steps first
        steps = engine.steps
        steps.begin(3, len(engine.tokens), params, torch.Generator().manual_seed(0))
        plans = [(T, m) for T in engine.sizes for m, Ts in engine.method_sizes.items() if T in Ts]
        for T, method in plans + [(1, "plain")] * engine.takes_plain:
            start = steps.start.clone()
            with NoHostReads():  # raises on any read of a device value
                if method == "lookup":
                    steps.place([7] * (T - 1))
                elif T > 1:
                    steps.draft(T, method)
                steps.verify(T, 10)
                steps.commit(T)
            assert steps.start.item() > start.item()  # the step really ran: at least one token committed
            steps.read()


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_give_the_uncaptured_tokens(arch, dtype, tiny_dirs):
    """On the GPU: the captured steps and the same steps uncaptured agree at every draft setting (fp32 and bf16:
    token for token, as both run the same kernels on the same shapes), and fp32 equals plain decoding."""
    target_dir, drafter_dir, _ = tiny_dirs[arch]
    target = load_target(target_dir, "cuda", dtype)
    plain = Engine(target, None, max_context=200, decode="graphs")
    assert plain.decode == "graphs"
    for draft in (15, "auto", 3):
        engines = {
            mode: Engine(target, load_drafter(drafter_dir, target), max_context=200, decode=mode, draft=draft)
            for mode in ("graphs", "fixed")
        }
        assert engines["graphs"].decode == "graphs", "capture failed (see the warning)"
        for prompt, n in zip(_prompts(target.cfg.vocab_size, 3, seed=5), (37, 16, 50), strict=True):
            params = SamplingParams(max_new_tokens=n)
            captured = run(engines["graphs"], prompt, params)[0]
            assert captured == run(engines["fixed"], prompt, params)[0]
            if dtype == torch.float32:
                assert captured == run(plain, prompt, params)[0]


@cuda
@pytest.mark.gpu
def test_cuda_graphs_sample_drafts_on_the_device(tiny_dirs):
    target = load_target(tiny_dirs["qwen3_5"][0], "cuda", torch.bfloat16)
    engine = Engine(target, load_drafter(tiny_dirs["qwen3_5"][1], target), max_context=200, decode="graphs")
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=40, seed=3)
    first, finished, _ = run(engine, [3, 4, 5], params)
    assert finished.reason == "length" and len(first) == 40
    engine.reset()
    assert run(engine, [3, 4, 5], params)[0] == first
    sampling = (0.8, 20, 0.9, 0.0)
    captured = engine.steps.graphs
    assert any(e.run is Steps._draft and e.sampling == sampling for e in captured)  # captured for this setting
    assert any(e.run is Steps._accept and e.sampling == sampling for e in captured)


@pytest.mark.parametrize("enough_s, rounds", [(1e9, 4), (0.0, 2)])
def test_the_cost_warm_up_takes_fewer_rounds_when_its_steps_are_slow(tiny_dirs, monkeypatch, enough_s, rounds):
    """auto's step costs are the fastest of the warm-up's rounds after the first (spec.COST_ROUNDS); once the
    measuring has taken COST_ENOUGH_S (a large model on a CPU: seconds a round), it stops after the second round.
    Either way every size and method has a figure."""
    from dflash_chat.engine import spec
    from dflash_chat.engine.steps import clock

    monkeypatch.setattr(spec, "COST_ENOUGH_S", enough_s)
    timed: list[tuple[str, int]] = []
    real = clock.Clock.timed
    monkeypatch.setattr(
        clock.Clock, "timed", lambda self, kind, T, *a: (timed.append((kind, T)), real(self, kind, T, *a))
    )
    engine = _pair(tiny_dirs, "qwen3_5", draft="auto")
    engine.warm_up()
    assert engine.costs is not None and set(engine.costs.verify) == set(engine.sizes)
    assert timed.count(("verify", max(engine.sizes))) == rounds
    assert all(engine.costs.draft[m][T] > 0 for m, sizes in engine.method_sizes.items() for T in sizes)


def test_an_answers_step_timings_all_reach_the_costs_a_few_steps_at_a_time(tiny_dirs, monkeypatch):
    """auto's costs take the loop's timings in batches of spec.COST_EVERY (making its tables again after every
    step cost more host time than choosing), and the rest when the answer ends: none is lost."""
    from dflash_chat.engine import spec
    from dflash_chat.engine.draft_length import Costs
    from dflash_chat.engine.steps import clock

    engine = _pair(tiny_dirs, "qwen3_5", draft="auto")
    engine.warm_up()
    batches: list[int] = []
    ended: list[int] = []
    observe_all, read = Costs.observe_all, clock.Clock.ended
    monkeypatch.setattr(
        Costs, "observe_all", lambda self, timings: (batches.append(len(timings)), observe_all(self, timings))
    )
    monkeypatch.setattr(
        clock.Clock, "ended", lambda self, wait=False: ended.append(len(got := read(self, wait))) or got
    )
    _, finished, _ = run(engine, [3, 4, 5], SamplingParams(max_new_tokens=40))
    assert sum(batches) == sum(ended) >= finished.stats.steps  # every interval timed: a verify a step, and drafts
    assert len(batches) >= 2 and all(n >= spec.COST_EVERY for n in batches[:-1]) and 0 < batches[-1]
    assert engine.costs is not None and sum(engine.costs.seen.values()) == sum(batches)
