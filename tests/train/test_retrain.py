"""The retrain stage's loop and figures: a run stopped and resumed from its checkpoint takes the same steps as
one that never stopped, SIGTERM stops it after the step in flight with a checkpoint, and the curve's held-out
figures count what they say on a case small enough to check by hand."""

from __future__ import annotations

import json
import math
import os
import signal
from types import SimpleNamespace

import pytest
import torch

from dflash_chat.train.corpus import Conversation, Corpus
from dflash_chat.train.resumable import train_resumable
from dflash_chat.train.stages.prepare import save_corpus
from dflash_chat.train.stages.retrain import (
    RetrainData,
    RetrainSettings,
    cached_data,
    induction_runs,
    measure,
    retrain_stage,
    retrain_step,
)
from dflash_chat.train.target import Chat, TargetShape, answer_hits, new_target, save_target

TINY = TargetShape(
    hidden_size=32,
    intermediate_size=64,
    layer_types=("linear_attention", "full_attention"),
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_head_dim=16,
    max_position_embeddings=1024,  # a tool chat's prompt lists its tools
)
PAD = 0


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from dflash_chat.models.demo import demo_dir

    return AutoTokenizer.from_pretrained(demo_dir() / "target")


def random_chat(gen: torch.Generator, length: int, prompt: int) -> Chat:
    ids = torch.randint(1, 300, (length,), generator=gen)
    return Chat(ids, torch.cat([torch.full((prompt,), -100), ids[prompt:]]))


@pytest.fixture(scope="module")
def data() -> RetrainData:
    gen = torch.Generator().manual_seed(0)
    chats = [random_chat(gen, 12 + i % 5, 6) for i in range(12)]
    return RetrainData(
        tools=chats[:6],
        copies=chats[6:],
        tokens=torch.randint(1, 300, (400,), generator=gen),
        heldout_calls=chats[:3],
        heldout_results=chats[3:5],
        heldout_copies=chats[6:9],
        heldout_windows=torch.randint(1, 300, (2, 16), generator=gen),
    )


def settings(path, **changes) -> RetrainSettings:
    fields = {"steps": 4, "lr": 1e-2, "warmup": 1, "tool_batch": 2, "copy_batch": 2, "window_batch": 2}
    fields |= {"induction_batch": 2, "induction_run": 6}
    fields |= {"seq_len": 16, "log_every": 1, "eval_every": 2, "path": path, **changes}
    return RetrainSettings(**fields)


def run(tokenizer, data, chosen: RetrainSettings, init_seed: int = 0):
    torch.set_num_threads(1)
    model = new_target(TINY, tokenizer, init_seed)
    step = retrain_step(model, data, chosen, PAD, "cpu")
    logs: list[str] = []
    progress = train_resumable(
        model, step, chosen, seed=3, evaluate=lambda: measure(model, data, PAD, "cpu"), log=logs.append
    )
    return model, progress, logs


def without_times(curve: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in ("seconds", "step_seconds")} for row in curve]


def test_a_resumed_run_takes_the_steps_an_unbroken_one_takes(tokenizer, data, tmp_path):
    whole, done, _ = run(tokenizer, data, settings(tmp_path / "whole" / "checkpoint.pt"))
    assert done.finished and done.step == 4 and [r["step"] for r in done.curve] == [0, 2, 4]

    first, part, _ = run(tokenizer, data, settings(tmp_path / "parts" / "checkpoint.pt", until=3))
    assert not part.finished and part.step == 3
    # a new process: the model built from another seed, the draws and the optimizer from scratch
    resumed, rest, logs = run(tokenizer, data, settings(tmp_path / "parts" / "checkpoint.pt"), init_seed=9)
    assert any("resumed from" in line and "at step 3" in line for line in logs)
    assert rest.finished and rest.step == 4
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert without_times(rest.curve) == without_times(done.curve)
    assert not torch.equal(first.state_dict()["lm_head.weight"], whole.state_dict()["lm_head.weight"])
    written = json.loads((tmp_path / "parts" / "checkpoint_curve.json").read_text())
    assert without_times(written) == without_times(done.curve)
    assert set(done.curve[1]) >= {"loss", "tools", "copy", "text", "induction", "heldout_loss", "copy_tokens"}
    assert not list((tmp_path / "parts").glob("*.partial"))


def test_a_run_carried_to_a_new_machine_goes_on_from_its_step_with_its_curve(tokenizer, data, tmp_path):
    """A chunk with a carry file writes it (float16 weights, no optimizer moments); a new machine (no checkpoint,
    another init) starts from it at its step, with its curve and draws, the rate warming up again; a carry file
    that is not there is a fresh start."""
    carried = tmp_path / "repo" / "retrain.carry.pt"
    _, part, _ = run(tokenizer, data, settings(tmp_path / "a" / "checkpoint.pt", until=3, carried=carried))
    saved = torch.load(carried, weights_only=False)
    assert "optimizer" not in saved and saved["state"]["step"] == 3
    assert {t.dtype for t in saved["model"].values() if t.is_floating_point()} == {torch.float16}
    checkpoint = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    assert os.path.getsize(carried) < os.path.getsize(tmp_path / "a" / "checkpoint.pt") / 4

    chosen = settings(tmp_path / "b" / "checkpoint.pt", carried=carried, warmup=2)
    model = new_target(TINY, tokenizer, 9)  # a new machine: another init, no checkpoint
    inner = retrain_step(model, data, chosen, PAD, "cpu")
    first: list[dict] = []

    def step(done, draws):
        if not first:
            first.append({"step": done, **{k: v.clone() for k, v in model.state_dict().items()}})
        return inner(done, draws)

    logs: list[str] = []
    progress = train_resumable(model, step, chosen, seed=3, log=logs.append)
    assert any("resumed from the carried run" in line and "at step 3" in line for line in logs)
    assert progress.finished and progress.step == 4 and first[0]["step"] == 3
    assert [r["step"] for r in progress.curve] == [0, 2, 4]
    assert without_times(progress.curve[:2]) == without_times(part.curve)
    for name, weight in checkpoint["model"].items():  # the carried weights, to float16's precision
        assert torch.equal(first[0][name], saved["model"][name].to(weight.dtype))
        assert torch.allclose(first[0][name].float(), weight.float(), rtol=1e-3, atol=1e-4)

    from dflash_chat.train.resumable import _rewarm

    assert _rewarm({"step": 3, "carried_at": 3}, 2) == 0.5  # the first step after the carry: half the rate
    assert _rewarm({"step": 4, "carried_at": 3}, 2) == 1.0
    assert _rewarm({"step": 0}, 40) == 1.0  # a run never carried keeps its schedule

    fresh = settings(tmp_path / "c" / "checkpoint.pt", carried=tmp_path / "none.pt", until=1)
    _, started, logs = run(tokenizer, data, fresh)
    assert started.step == 1 and not any("carried run" in line for line in logs)


def test_sigterm_stops_after_the_step_in_flight_with_a_checkpoint(tokenizer, data, tmp_path):
    path = tmp_path / "checkpoint.pt"
    chosen = settings(path, steps=6)
    model = new_target(TINY, tokenizer, 0)
    inner = retrain_step(model, data, chosen, PAD, "cpu")

    def step(done, draws):
        if done == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return inner(done, draws)

    before = signal.getsignal(signal.SIGTERM)
    logs: list[str] = []
    progress = train_resumable(model, step, chosen, seed=0, log=logs.append)
    assert progress.step == 2 and not progress.finished
    assert "stopped by SIGTERM after step 2" in logs
    assert torch.load(path, weights_only=False)["state"]["step"] == 2
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow(seconds=30)
def test_the_stage_goes_on_from_its_checkpoint_and_writes_the_target_when_done(tokenizer, tmp_path):
    from dflash_chat.models.demo import TOOL_PROMPTS_FILE

    work, source = tmp_path / "work", tmp_path / "source"
    save_target(new_target(TINY, tokenizer, 0), tokenizer, source)
    code = 'def twice(value):\n    """The value, twice."""\n    return 2 * value + 0 * len(str(value))'
    asked = [
        Conversation([{"role": "user", "content": f"Show `f{i}`."}, {"role": "assistant", "content": answer}])
        for i, answer in enumerate([f"```python\n{code}\n```", "A paragraph that is long enough to copy. " * 3] * 4)
    ]
    save_corpus(Corpus(train=asked[:6], heldout=asked[6:]), work / "corpus.json")
    logs: list[str] = []

    def chunk(until: int):
        chosen = RetrainSettings(steps=0, tool_batch=2, copy_batch=2, window_batch=1, seq_len=32, eval_every=2)
        chosen.until = until
        return retrain_stage(
            work,
            source=source,
            seed=0,
            steps=4,
            device="cpu",
            settings=chosen,
            tool_chats=8,
            copy_count=8,
            random_count=8,
            log=logs.append,
        )

    first = chunk(until=2)
    assert first.step == 2 and not first.finished and not (work / "target").exists()
    assert (work / "retrain" / "checkpoint.pt").exists() and (work / TOOL_PROMPTS_FILE).exists()
    assert any(line.startswith("retrain: 10 tool chats, 16 copy tasks") for line in logs)  # 8 calls, 2 questions
    done = chunk(until=4)
    assert done.finished and [row["step"] for row in done.curve] == [0, 2, 4]
    assert any("resumed from" in line and "at step 2" in line for line in logs)
    assert (work / "target" / "model.safetensors").exists()
    curve = json.loads((work / "retrain" / "checkpoint_curve.json").read_text())
    assert [row["step"] for row in curve] == [0, 2, 4] and all(0 <= row["copy_tokens"] <= 1 for row in curve)


def test_an_induction_run_is_corpus_tokens_then_the_same_again_labelled_where_it_can_be_read():
    tokens = torch.arange(1000, 1100)
    ids, labels = induction_runs(tokens, 3, 5, torch.Generator().manual_seed(0))
    assert ids.shape == labels.shape == (3, 10)
    assert torch.equal(ids[:, :5], ids[:, 5:]) and bool(((ids >= 1000) & (ids < 1100)).all())
    assert bool((labels[:, :6] == -100).all()) and torch.equal(labels[:, 6:], ids[:, 6:])
    assert not torch.equal(ids[0], ids[1])  # each row its own run


def test_the_data_is_kept_for_the_next_chunk_and_made_again_from_other_settings(data, tmp_path):
    path, made = tmp_path / "data.pt", []

    def make(seed):
        made.append(seed)
        return data._replace(tokens=data.tokens + seed)

    first = cached_data(path, (0, 32), lambda: make(0))
    again = cached_data(path, (0, 32), lambda: make(1))
    other = cached_data(path, (1, 32), lambda: make(1))
    assert made == [0, 1] and torch.equal(again.tokens, first.tokens) and torch.equal(other.tokens, data.tokens + 1)
    assert torch.equal(again.tools[0].ids, data.tools[0].ids)


class NextButEight(torch.nn.Module):
    """Ranks first the token that comes next (logit 1, the rest 0), except 8 (it ranks 0 first there)."""

    def forward(self, input_ids, labels=None):
        nxt = torch.roll(input_ids, -1, dims=1)
        nxt[nxt == 8] = 0
        logits = torch.nn.functional.one_hot(nxt, 10).float()
        loss = None
        if labels is not None:
            flat = logits[:, :-1].reshape(-1, 10)
            loss = torch.nn.functional.cross_entropy(flat, labels[:, 1:].reshape(-1), ignore_index=-100)
        return SimpleNamespace(logits=logits, loss=loss)


def test_the_held_out_figures_on_a_case_counted_by_hand():
    right = Chat(torch.tensor([5, 6, 7, 9]), torch.tensor([-100, -100, 7, 9]))  # 2 of 2 answer tokens
    wrong = Chat(torch.tensor([5, 6, 7, 8]), torch.tensor([-100, 6, 7, 8]))  # 2 of 3: 8 is missed
    short = Chat(torch.tensor([1, 2]), torch.tensor([-100, 2]))  # 1 of 1, padded in a batch
    for chunk in (1, 2, 8):
        assert answer_hits(NextButEight(), [right, wrong, short], PAD, chunk=chunk) == (6, 5, 3, 2)
    data = RetrainData(
        tools=[],
        copies=[],
        tokens=torch.zeros(0),
        heldout_calls=[right, wrong],
        heldout_results=[wrong],
        heldout_copies=[short, right, right, wrong],
        heldout_windows=torch.tensor([[1, 2, 3, 8, 9]]),  # 3 of 4 next tokens ranked first (8 is not)
    )
    figures = measure(NextButEight(), data, PAD, "cpu")
    hit, miss = math.log(math.e + 9) - 1, math.log(math.e + 9)  # cross-entropy of one-hot logits
    assert figures["heldout_loss"] == pytest.approx((3 * hit + miss) / 4)
    assert figures["call_right"] == 0.5 and figures["call_tokens"] == pytest.approx(4 / 5)
    assert figures["result_right"] == 0.0 and figures["result_tokens"] == pytest.approx(2 / 3)
    assert figures["copy_right"] == 0.75 and figures["copy_tokens"] == pytest.approx(7 / 8)
