"""The training code end to end on a tiny budget: corpus -> tokenizer -> target -> drafter -> loader."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dflash_chat.train.drafter import DrafterSettings, DrafterShape
from dflash_chat.train.stages.answers import AnswerSettings
from dflash_chat.train.stages.drafters import train_dflash2_stage, train_drafter_stage
from dflash_chat.train.stages.finetune import finetune_stage
from dflash_chat.train.stages.prepare import load_corpus, prepare, train_target_stage
from dflash_chat.train.stages.ship import ship
from dflash_chat.train.stages.tools import tools_stage
from dflash_chat.train.target import MixedSettings, TargetShape, TrainSettings

TINY_TARGET = TargetShape(
    hidden_size=64,
    intermediate_size=128,
    layer_types=("linear_attention", "full_attention"),
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_head_dim=32,
    max_position_embeddings=2048,  # the tools stage's prompts: a tools block in a 400-token vocabulary
)
TINY_DRAFTER = DrafterShape(
    num_layers=1, intermediate_size=128, num_heads=2, num_kv_heads=1, head_dim=32, target_layer_ids=(0, 1), block_size=8
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("work")
    logs: list[str] = []
    prepare(work, seed=0, vocab_size=400, max_files=12, log=logs.append)
    target_losses = train_target_stage(
        work,
        seed=0,
        steps=40,
        device="cpu",
        shape=TINY_TARGET,
        settings=TrainSettings(steps=40, batch_size=8, seq_len=64, lr=3e-3, warmup=5),
        log=logs.append,
    )
    drafter_losses = train_drafter_stage(
        work,
        seed=0,
        steps=40,
        device="cpu",
        answering=AnswerSettings(generated=8, max_new_tokens=24),
        shape=TINY_DRAFTER,
        settings=DrafterSettings(steps=40, seqs_per_step=4, anchors_per_seq=8, lr=3e-3, warmup=5),
        log=logs.append,
    )
    out = tmp_path_factory.mktemp("out")
    ship(work, out, log=logs.append)
    dflash2_losses = train_dflash2_stage(
        work,
        seed=0,
        steps=30,
        device="cpu",
        source=out / "drafter",
        target_dir=out / "target",
        answering=AnswerSettings(generated=8, max_new_tokens=24),
        settings=DrafterSettings(steps=30, seqs_per_step=4, anchors_per_seq=8, lr=3e-3, warmup=5),
        log=logs.append,
    )
    ship(work, out, log=logs.append)
    logs.append(dflash2_losses)
    finetuned = tmp_path_factory.mktemp("finetuned")
    shutil.copytree(out, finetuned, dirs_exist_ok=True)
    finetune_losses = finetune_stage(
        work,
        kind="dflash2",
        source=finetuned / "drafter2",
        target_dir=finetuned / "target",
        seed=0,
        steps=30,
        device="cpu",
        answering=AnswerSettings(generated=8, max_new_tokens=24, sampled_share=0.5, tool_share=0.25),
        settings=DrafterSettings(steps=30, seqs_per_step=4, anchors_per_seq=8, lr=3e-3, warmup=5, distill=1.0),
        hard_anchors=0.5,
        log=logs.append,
    )
    ship(work, finetuned, log=logs.append)
    return work, out, target_losses, drafter_losses, logs + [(finetuned, finetune_losses)]


def _mean(xs):
    return sum(xs) / len(xs)


def test_target_loss_goes_down(trained):
    _, _, losses, _, _ = trained
    assert _mean(losses[-8:]) < _mean(losses[:8]) - 0.5


def test_drafter_loss_goes_down(trained):
    _, _, _, losses, logs = trained
    assert _mean(losses[-8:]) < _mean(losses[:8]) - 0.3
    assert any("teacher-forced acceptance length" in line for line in logs)


def test_dflash2_stage_trains_and_ships_a_dflash2_drafter(trained):
    """The dflash2 stage starts from the shipped drafter, lowers its loss and ships drafter2/, which the
    engine loads as a DFlash2 drafter and runs losslessly."""
    from dflash_chat.engine.load import load_drafter, load_target
    from dflash_chat.engine.models.dflash2 import DFlash2Drafter
    from dflash_chat.train.evaluate import measure_pair

    _, out, _, _, logs = trained
    losses = next(line for line in logs if isinstance(line, list))
    assert _mean(losses[-8:]) < _mean(losses[:8]) - 0.05
    assert any(isinstance(line, str) and line.startswith("dflash2: teacher-forced acceptance") for line in logs)
    cfg = json.loads((out / "drafter2" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["dflash_config"]["selector_top_k"] == 8
    assert isinstance(load_drafter(out / "drafter2", load_target(out / "target", "cpu", torch.float32)), DFlash2Drafter)
    prompts = json.loads((out / "heldout_prompts.json").read_text())[:2]
    report = measure_pair(out / "target", out / "drafter2", prompts=prompts, max_new_tokens=24)
    assert report.identical and report.new_tokens > 2


def test_finetune_trains_a_shipped_drafter_on_greedy_and_sampled_answers(trained):
    """The finetune stage starts from a shipped DFlash2 drafter, answers half its prompts by sampling at the
    app's settings (a quarter of them tool chats: requests, and tool results to answer), draws half its blocks where the engine's steps start, trains with the distillation term
    (its loss goes down) and ships a drafter the engine runs losslessly."""
    from dflash_chat.train.evaluate import measure_pair

    _, _, _, _, logs = trained
    finetuned, losses = logs[-1]
    assert _mean(losses[-8:]) < _mean(losses[:8])
    data = [line for line in logs if isinstance(line, str) and "of them sampled" in line]
    assert "0 of them sampled, 0 to tool chats" in data[0] and "4 of them sampled, 2 to tool chats" in data[-1]
    assert any(isinstance(line, str) and "on sampled ones" in line for line in logs)
    assert any(isinstance(line, str) and "0.5 of the anchors where the engine's steps start" in line for line in logs)
    prompts = json.loads((finetuned / "heldout_prompts.json").read_text())[:2]
    report = measure_pair(finetuned / "target", finetuned / "drafter2", prompts=prompts, max_new_tokens=24)
    assert report.identical and report.new_tokens > 2


def test_sampled_answers_are_seeded_and_differ_from_greedy(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_chat.train.data import Sampled, target_answers

    work, out, _, _, _ = trained
    tokenizer = AutoTokenizer.from_pretrained(out / "target")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    prompts = load_corpus(work / "corpus.json").heldout[:4]
    hot = Sampled(1.5, 1.0, 0)
    common = dict(max_new_tokens=16, thinking_share=0.0)
    first = target_answers(target, tokenizer, prompts, sampled=hot, seed=3, **common)
    again = target_answers(target, tokenizer, prompts, sampled=hot, seed=3, **common)
    greedy = target_answers(target, tokenizer, prompts, **common)
    assert [s.ids.tolist() for s in first] == [s.ids.tolist() for s in again]
    assert [s.ids.tolist() for s in first] != [s.ids.tolist() for s in greedy]


def test_shipped_files_have_the_formats_the_loader_reads(trained):
    _, out, _, _, _ = trained
    target_cfg = json.loads((out / "target" / "config.json").read_text())
    assert target_cfg["model_type"] == "qwen3_5_text"
    assert target_cfg["architectures"] == ["Qwen3_5ForCausalLM"]
    drafter_cfg = json.loads((out / "drafter" / "config.json").read_text())
    assert drafter_cfg["architectures"] == ["DFlashDraftModel"]
    assert drafter_cfg["dflash_config"]["target_layer_ids"] == [0, 1]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out / "target")
    assert drafter_cfg["dflash_config"]["mask_token_id"] == tok.convert_tokens_to_ids("<|mask|>")
    assert json.loads((out / "heldout_prompts.json").read_text())[0][0]["role"] == "user"


def test_trained_pair_runs_losslessly_through_the_engine(trained):
    from dflash_chat.train.evaluate import measure_pair

    _, out, _, _, _ = trained
    prompts = json.loads((out / "heldout_prompts.json").read_text())[:2]
    report = measure_pair(out / "target", out / "drafter", prompts=prompts, max_new_tokens=24)
    assert report.identical
    assert report.new_tokens > 2
    assert report.mean_acceptance_length >= 1.0


def test_the_vision_stage_gives_a_shipped_pair_a_tower_it_reads_images_with(trained, tmp_path):
    """The recipe's vision stage on what a run ships (not only on the demo in demo_data): its tokenizer's bytes take
    the vision tokens, and the pair loads the tower and answers a turn with an image."""
    import threading

    from PIL import Image

    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.runtime.images import image_part
    from dflash_chat.runtime.session import EngineSession
    from dflash_chat.train.vision import vision_stage

    _, out, _, _, _ = trained
    shipped = tmp_path / "out"
    shutil.copytree(out, shipped)
    tower = vision_stage(shipped, log=lambda _: None)
    pair = load_pair(shipped / "target", shipped / "drafter", device="cpu", max_context=512, vision=tower)
    session = EngineSession(pair)
    picture = Image.new("RGB", (100, 70), (200, 30, 30))  # 96 x 64 within the pixel budget: 6 tokens
    turns = [{"role": "user", "content": [image_part(picture), {"type": "text", "text": "what is it?"}]}]
    prompt = session.chat_prompt(turns, False, None)
    assert [image.tokens for image in prompt.images] == [6]
    assert prompt.ids.count(pair.engine.image_token_id) == 6
    end = session.answer(prompt, SamplingParams(max_new_tokens=4), threading.Event(), lambda chunk: None)
    assert end.reason in ("length", "stop") and end.stats is not None and end.stats.prompt_tokens == len(prompt.ids)


def test_the_mtp_stage_trains_the_targets_own_mtp_layer_and_ships_it_inside(trained, tmp_path):
    """The mtp stage (the target frozen) lifts the layer's held-out teacher-forced agreement, writes the target
    with the layer inside its safetensors (`mtp.*`, `mtp_num_hidden_layers`) to work/target, leaves the
    target's own weights as they were, and the engine loads it as an `mtp` method that decodes losslessly."""
    from safetensors.torch import load_file

    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.train.mtp import MTPSettings
    from dflash_chat.train.stages.mtp import mtp_stage

    work, out, _, _, _ = trained
    source = tmp_path / "target"
    shutil.copytree(out / "target", source)
    logs: list[str] = []
    agreement = mtp_stage(
        work,
        target_dir=source,
        seed=0,
        steps=40,
        device="cpu",
        answering=AnswerSettings(generated=8, max_new_tokens=24, sampled_share=0.5),
        settings=MTPSettings(steps=40, seqs_per_step=4, lr=3e-3, warmup=5),
        log=logs.append,
    )
    line = next(line for line in logs if line.startswith("mtp: teacher-forced top-1 agreement"))
    before = float(line.rsplit("before training: ", 1)[1].rstrip(")"))
    assert agreement > before + 0.2
    shipped = work / "target"
    assert json.loads((shipped / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    weights = load_file(str(shipped / "model.safetensors"))
    original = load_file(str(source / "model.safetensors"))
    assert {k for k in weights if not k.startswith("mtp.")} == set(original)
    assert all(torch.equal(weights[k], v) for k, v in original.items())  # the target stayed frozen
    assert "mtp.fc.weight" in weights and "mtp.layers.0.self_attn.q_proj.weight" in weights
    pair = load_pair(shipped, None, device="cpu", dtype=torch.float32, speculate="mtp", draft=2)
    plain = load_pair(shipped, None, device="cpu", dtype=torch.float32, speculate="none")
    assert pair.engine.mtp is not None
    from dflash_chat.runtime.prompt import build_prompt

    chat = json.loads((out / "heldout_prompts.json").read_text())[0]
    prompt = build_prompt(pair.tokenizer, chat, thinking=False).ids
    params = SamplingParams(temperature=0, max_new_tokens=24)
    texts = [[t for e in p.engine.generate(prompt, params) for t in getattr(e, "token_ids", [])] for p in (plain, pair)]
    assert texts[0] == texts[1] and len(texts[0]) > 2


def test_the_mtp_stage_trains_the_target_this_run_made_else_the_shipped_one(tmp_path):
    """`--stages target,...,mtp` trains the layer for the target the run just trained (work/target);
    `--stages prepare,mtp,ship` for the shipped one (--out/target)."""
    import argparse

    from dflash_chat.train import recipe

    calls = []
    args = argparse.Namespace(work=tmp_path / "w", out=tmp_path / "o", seed=0, drafter_steps=5, stages="")
    for stages, want in (("prepare, target,mtp,ship", args.work), ("prepare,mtp,ship", args.out)):
        args.stages = stages
        original = recipe.mtp_stage
        recipe.mtp_stage = lambda work, **kw: calls.append(kw["target_dir"])  # type: ignore[assignment]
        try:
            recipe._mtp(args, recipe.preset("cpu"), "cpu", lambda *_: None)
        finally:
            recipe.mtp_stage = original
        assert calls[-1] == want / "target"


@pytest.fixture(scope="module")
def tooled(trained, tmp_path_factory):
    """The tools stage on a copy of the shipped tiny pair: its target trained further on tool chats, shipped."""
    work, out, _, _, _ = trained
    tooled = tmp_path_factory.mktemp("tooled")
    shutil.copytree(out, tooled, dirs_exist_ok=True)
    logs: list[str] = []
    losses = tools_stage(
        work,
        source=tooled / "target",
        seed=0,
        steps=30,
        device="cpu",
        settings=MixedSettings(steps=30, batch_size=2, seq_len=64, lr=3e-3, warmup=5, chat_batch=2),
        chats=40,
        checked=2,
        log=logs.append,
    )
    ship(work, tooled, log=logs.append)
    return tooled, losses, logs


def test_tools_stage_trains_the_target_on_tool_chats_and_ships_the_held_out_ones(trained, tooled):
    """The tools stage lowers the target's loss on tool chats beside its corpus, checks what it kept and what
    it learnt, and ships a target the engine loads, with held-out tool chats whose names it never trained on."""
    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.train.tool_corpus import chat_of_record, names, training_chats, word_pools

    work, out, _, _, _ = trained
    folder, losses, logs = tooled
    assert len(losses) == 30 and _mean(losses[-8:]) < _mean(losses[:8]) - 0.3
    assert any(line.startswith("tools: 48 tool chats") for line in logs)  # 40 with a call, 8 corpus questions
    assert any("held-out chat answers the same (greedy, 48 tokens):" in line and "of 2" in line for line in logs)
    assert any(line.startswith("tools: held-out turns right (greedy): call") for line in logs)
    assert any(line.startswith("target step 25: held-out answers, teacher-forced:") for line in logs)
    records = json.loads((folder / "tool_prompts.json").read_text())["chats"]
    heldout = [chat_of_record(r) for r in records]
    assert len(heldout) == 48 + 16 and [c.call is None for c in heldout].count(True) == 16
    assert not names(heldout) & names(training_chats(word_pools(), 40, 0))
    assert (folder / "target" / "model.safetensors").read_bytes() != (out / "target" / "model.safetensors").read_bytes()
    pair = load_pair(folder / "target", None, device="cpu", dtype=torch.float32)
    from dflash_chat.bench.comparison import generate
    from dflash_chat.train.tool_bench import prompt_ids

    run = generate(
        pair.engine,
        prompt_ids(pair.tokenizer, [{"role": "user", "content": heldout[0].request}], heldout[0]),
        SamplingParams(temperature=0.0, max_new_tokens=8),
    )
    assert 1 <= len(run.tokens) <= 8
