"""The demo pair, stage by stage: prepare (corpus + tokenizer), target, drafter, ship.

Each stage reads what the one before it wrote in a work folder, so a stage can run again alone
(or on another machine). Everything is seeded; step counts are printed so a run can be repeated.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch

from dflash_chat.models.demo import HELDOUT_FILE
from dflash_chat.models.sizes import size_text
from dflash_chat.train.common import Log
from dflash_chat.train.corpus import Conversation, Corpus, build_corpus, free_form_prompts
from dflash_chat.train.drafter import (
    DrafterSettings,
    DrafterShape,
    Sequence,
    drafter_config_dict,
    load_for_training,
    new_drafter,
    save_drafter,
    teach_all,
    teacher_forced_acceptance,
    train_drafter,
)
from dflash_chat.train.target import TargetShape, TrainSettings, new_target, save_target, train_target
from dflash_chat.train.tokenizer import MASK_TOKEN, save_tokenizer, train_tokenizer

DFLASH2_STEPS = 800  # the dflash2 stage's default (it starts from a trained drafter: no calibration run)
DFLASH2_LR = 7e-4  # gentler than training from scratch: the backbone is trained already
FINETUNE_STEPS = 600
FINETUNE_LR = 5e-4
FINETUNE_DISTILL = 1.0  # the distillation term's weight beside the hard labels
FINETUNE_SAMPLED_SHARE = 0.5  # of the training prompts answered by sampling at the app's settings


@dataclass
class Preset:
    """Batch sizes and data amounts for one kind of device (step counts come from the budget)."""

    target: TrainSettings
    drafter: DrafterSettings
    generated: int  # training prompts the target answers for the drafter's data
    gen_batch: int
    max_new_tokens: int


def preset(device: str) -> Preset:
    if str(device).startswith("cuda"):
        return Preset(
            TrainSettings(steps=0, batch_size=32, seq_len=512, lr=2e-3, warmup=100, log_every=100),
            DrafterSettings(steps=0, seqs_per_step=16, anchors_per_seq=32, lr=1e-3, warmup=50, log_every=100),
            generated=3072,
            gen_batch=512,
            max_new_tokens=256,
        )
    return Preset(
        TrainSettings(steps=0, batch_size=8, seq_len=256, lr=2e-3, warmup=30, log_every=20),
        DrafterSettings(steps=0, seqs_per_step=4, anchors_per_seq=32, lr=1.5e-3, warmup=20, log_every=20),
        generated=1024,
        gen_batch=64,
        max_new_tokens=160,
    )


def prepare(work: Path, *, seed: int, vocab_size: int = 6144, max_files: int | None = None, log: Log = print) -> None:
    started = time.perf_counter()
    corpus = build_corpus(seed=seed, max_files=max_files)
    save_corpus(corpus, work / "corpus.json")
    texts = [m["content"] for c in corpus.train for m in c.messages]
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    save_tokenizer(tokenizer, work / "tokenizer")
    log(
        f"prepared {len(corpus.train)} training chats, {len(corpus.heldout)} held out, "
        f"vocab {len(tokenizer)} ({time.perf_counter() - started:.0f}s)"
    )


def train_target_stage(
    work: Path,
    *,
    seed: int,
    steps: int,
    device: str,
    shape: TargetShape | None = None,
    settings: TrainSettings | None = None,
    log: Log = print,
) -> list[float]:
    from transformers import AutoTokenizer

    from dflash_chat.train.data import packed_tokens

    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    corpus = load_corpus(work / "corpus.json")
    tokens = packed_tokens(tokenizer, corpus.train)
    model = new_target(shape or TargetShape(), tokenizer, seed)
    settings = settings or TrainSettings(steps=steps)
    settings.steps = steps
    log(
        f"target: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {len(tokens)} training tokens, "
        f"{steps} steps of {settings.batch_size}x{settings.seq_len} on {device}"
    )
    losses = train_target(model, tokens, settings, seed=seed, device=device, log=log)
    save_target(model, tokenizer, work / "target")
    return losses


def train_drafter_stage(
    work: Path,
    *,
    seed: int,
    steps: int,
    device: str,
    generated: int = 2000,
    shape: DrafterShape | None = None,
    settings: DrafterSettings | None = None,
    max_new_tokens: int = 192,
    gen_batch: int = 64,
    free_share: float = 0.5,
    log: Log = print,
) -> list[float]:
    tokenizer, target, answers = _target_and_answers(
        work,
        work / "target",
        seed=seed,
        device=device,
        generated=generated,
        max_new_tokens=max_new_tokens,
        gen_batch=gen_batch,
        free_share=free_share,
        log=log,
    )
    shape = shape or DrafterShape()
    config = drafter_config_dict(shape, target.config, tokenizer.convert_tokens_to_ids(MASK_TOKEN))
    drafter = new_drafter(config, target, seed)
    settings = settings or DrafterSettings(steps=steps)
    settings.steps = steps
    log(
        f"drafter: {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M parameters, block {shape.block_size}, "
        f"taps {list(shape.target_layer_ids)}, {steps} steps on {device}"
    )
    losses = train_drafter(drafter, target, answers.own, settings, seed=seed, device=device, log=log)
    acc = teacher_forced_acceptance(drafter, target, answers.held, seed=seed, device=device)
    log(f"drafter: teacher-forced acceptance length on held-out target answers: {acc:.2f}")
    save_drafter(drafter, config, work / "drafter")
    return losses


class Answers(NamedTuple):
    """The target's answers a drafter stage trains and checks on."""

    own: list[Sequence]  # to training prompts: greedy, and drawn at the app's settings for a share of them
    held: list[Sequence]  # greedy, to 32 held-out prompts
    held_sampled: list[Sequence]  # drawn at the app's settings, to the same prompts (empty without a share)


def _target_and_answers(work: Path, target_dir: Path, **kwargs):
    """(tokenizer, target, `Answers`) for a drafter stage: the target as shipped (bf16 weights), upcast
    like the loader does on the CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(kwargs["device"])
    return tokenizer, target, _target_answers(work, target, tokenizer, **kwargs)


def _target_answers(
    work: Path,
    target,
    tokenizer,
    *,
    seed: int,
    device: str,
    generated: int,
    log: Log,
    max_new_tokens: int = 160,
    gen_batch: int = 64,
    free_share: float = 0.5,
    sampled_share: float = 0.0,
) -> Answers:
    """The target's answers to `generated` training prompts (a `sampled_share` of them drawn at the app's
    sampling settings, the rest greedy) and to 32 held-out ones: a drafter's data."""
    from dflash_chat.train.data import Sampled, target_answers

    corpus = load_corpus(work / "corpus.json")
    rng = random.Random(seed)
    free = round(free_share * generated)
    prompts = rng.sample(corpus.train, min(generated - free, len(corpus.train)))
    prompts += free_form_prompts(corpus.train, rng, free)
    rng.shuffle(prompts)
    drawn = round(sampled_share * len(prompts))
    started = time.perf_counter()

    def answers(prompts: list[Conversation], sampled: Sampled | None = None, thinking_share: float = 0.2):
        return target_answers(
            target,
            tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            thinking_share=thinking_share,
            batch_size=gen_batch,
            seed=seed,
            device=device,
            sampled=sampled,
        )

    own = answers(prompts[drawn:])
    held = answers(corpus.heldout[:32], thinking_share=0.0)
    held_sampled: list[Sequence] = []
    if drawn:
        app = app_sampling()
        own += answers(prompts[:drawn], app)
        held_sampled = answers(corpus.heldout[:32], app, thinking_share=0.0)
    log(
        f"drafter data: {len(own)} target answers, {drawn} of them sampled ({sum(len(q.ids) for q in own)} tokens, "
        f"{time.perf_counter() - started:.0f}s)"
    )
    return Answers(own, held, held_sampled)


def app_sampling():
    """The app's default sampling settings (settings.py), as the target's answers are drawn with them."""
    from dflash_chat.settings import Settings
    from dflash_chat.train.data import Sampled

    app = Settings()
    return Sampled(app.temperature, app.top_p, app.top_k)


def finetune_stage(
    work: Path,
    *,
    kind: str,
    source: Path,
    target_dir: Path,
    seed: int,
    steps: int,
    device: str,
    generated: int,
    settings: DrafterSettings,
    sampled_share: float = FINETUNE_SAMPLED_SHARE,
    max_new_tokens: int = 160,
    gen_batch: int = 64,
    free_share: float = 0.5,
    hard_anchors: float = 0.0,
    log: Log = print,
) -> list[float]:
    """A shipped drafter (`source`, DFlash or DFlash2) trained further against its target on fresh answers,
    a share of them sampled at the app's settings, with the distillation term (settings.distill): what
    makes sampled drafts (T > 0) land (train/drafter.py, 4.). `hard_anchors`: the share of blocks drawn
    where the engine's steps start (train/anchors.py), by the source drafter's first drafts. Written to
    work/drafter or work/drafter2."""
    _, target, answers = _target_and_answers(
        work,
        target_dir,
        seed=seed,
        device=device,
        generated=generated,
        max_new_tokens=max_new_tokens,
        gen_batch=gen_batch,
        free_share=free_share,
        sampled_share=sampled_share,
        log=log,
    )
    drafter, config = load_for_training(source, target)
    settings.steps = steps
    log(
        f"finetune: {kind} drafter from {source}, {steps} steps on {device}, distill {settings.distill}, "
        f"accept {settings.accept}"
    )

    def acceptance() -> str:
        greedy = teacher_forced_acceptance(drafter, target, answers.held, seed=seed, device=device)
        drawn = teacher_forced_acceptance(drafter, target, answers.held_sampled, seed=seed, device=device)
        return f"{greedy:.2f} on greedy answers, {drawn:.2f} on sampled ones"

    before = acceptance()
    taught = None
    if hard_anchors:
        from dflash_chat.train.anchors import lean_to_engine_anchors
        from dflash_chat.train.dflash2 import app_params

        started = time.perf_counter()
        taught = teach_all(target, answers.own, drafter.target_layer_ids, device)
        lean_to_engine_anchors(drafter, target, answers.own, taught, app_params(), hard_anchors, device)
        log(
            f"finetune: {hard_anchors:g} of the anchors where the engine's steps start ({time.perf_counter() - started:.0f}s)"
        )
    losses = train_drafter(drafter, target, answers.own, settings, seed=seed, device=device, log=log, taught=taught)
    log(f"finetune: teacher-forced acceptance length on held-out target answers: {acceptance()} (before: {before})")
    save_drafter(drafter, config, work / ("drafter2" if kind == "dflash2" else "drafter"))
    return losses


CALIBRATE_ANSWERS = 64  # sampled answers to training prompts the calibrate stage fits the selector's scale on


def calibrate_stage(
    work: Path,
    *,
    source: Path,
    target_dir: Path,
    seed: int,
    device: str,
    generated: int = CALIBRATE_ANSWERS,
    log: Log = print,
) -> float:
    """The DFlash2 drafter in `source` with its selector's scale fitted to the target's answers to `generated`
    training prompts, all sampled at the app's settings (train/calibrate.py); written to work/drafter2."""
    from dflash_chat.train.calibrate import apply_scale, best_scale, expected_accepts
    from dflash_chat.train.dflash2 import app_params

    _, target, answers = _target_and_answers(
        work, target_dir, seed=seed, device=device, generated=generated, sampled_share=1.0, log=log
    )
    drafter, config = load_for_training(source, target)
    if getattr(drafter.cfg, "dflash2", None) is None:
        raise ValueError(f"{source} is not a DFlash2 drafter: only DFlash2's selector has a scale to fit")
    drafter.to(device).eval()
    sampling = app_params()
    accepts = expected_accepts(drafter, target, answers.own, sampling, seed=seed, device=device)
    scale = best_scale(accepts)
    shown = ", ".join(f"{s:g}: {v:.3f}" for s, v in accepts.items())
    log(f"calibrate: expected accepted drafts per block by selector scale ({shown}); scale {scale:g}")
    held = expected_accepts(
        drafter, target, answers.held_sampled, sampling, scales=(1.0, scale), seed=seed, device=device
    )
    log(f"calibrate: on held-out sampled answers {held[scale]:.3f} at scale {scale:g}, {held[1.0]:.3f} unscaled")
    apply_scale(drafter, config, scale)
    save_drafter(drafter, config, work / "drafter2")
    return scale


def train_dflash2_stage(
    work: Path,
    *,
    seed: int,
    steps: int,
    device: str,
    source: Path,
    target_dir: Path,
    generated: int,
    settings: DrafterSettings,
    max_new_tokens: int = 160,
    gen_batch: int = 64,
    free_share: float = 0.5,
    log: Log = print,
) -> list[float]:
    """The DFlash2 drafter: `source`'s DFlash drafter with DFlash2's modules added (train/dflash2.py),
    trained against the target in `target_dir` on its fresh greedy answers; written to work/drafter2."""
    from dflash_chat.train.dflash2 import dflash2_config_dict, from_dflash

    _, target, answers = _target_and_answers(
        work,
        target_dir,
        seed=seed,
        device=device,
        generated=generated,
        max_new_tokens=max_new_tokens,
        gen_batch=gen_batch,
        free_share=free_share,
        log=log,
    )
    dflash, config = load_for_training(source, target)
    config2 = dflash2_config_dict(config)
    drafter = from_dflash(dflash, config2, target, seed)
    settings.steps = steps
    log(
        f"dflash2: {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M parameters from {source}, "
        f"{steps} steps on {device}"
    )
    before = teacher_forced_acceptance(dflash.to(device), target, answers.held, seed=seed, device=device)
    losses = train_drafter(drafter, target, answers.own, settings, seed=seed, device=device, log=log)
    after = teacher_forced_acceptance(drafter, target, answers.held, seed=seed, device=device)
    log(
        f"dflash2: teacher-forced acceptance length on held-out target answers: {after:.2f} "
        f"(the DFlash drafter it started from: {before:.2f})"
    )
    save_drafter(drafter, config2, work / "drafter2")
    return losses


def ship(work: Path, out: Path, log: Log = print) -> None:
    """Copy what the stages made into `out` (target/ with tokenizer files, drafter/, drafter2/)."""
    for name in ("target", "drafter", "drafter2"):
        if not (work / name).is_dir():
            continue
        dest = out / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(work / name, dest)
    prompts = [c.prompt_messages for c in load_corpus(work / "corpus.json").heldout]
    (out / HELDOUT_FILE).write_text(json.dumps(prompts, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"shipped the demo pair to {out} ({size_text(size)})")


def save_corpus(corpus: Corpus, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        split: [
            {
                "messages": c.messages,
                "reasoning": c.reasoning,
                "tags": sorted(c.tags),
                "subject": c.subject,
                "summary": c.summary,
            }
            for c in convs
        ]
        for split, convs in (("train", corpus.train), ("heldout", corpus.heldout))
    }
    path.write_text(json.dumps(data))


def load_corpus(path: Path) -> Corpus:
    data = json.loads(path.read_text())

    def convs(rows):
        return [
            Conversation(
                r["messages"],
                r["reasoning"],
                set(r["tags"]),
                tuple(r["subject"]) if r.get("subject") else None,
                r.get("summary"),
            )
            for r in rows
        ]

    return Corpus(train=convs(data["train"]), heldout=convs(data["heldout"]))


def calibrate_target_steps(
    work: Path, seconds: float, device: str, seed: int, settings: TrainSettings | None = None
) -> int:
    """How many target steps fit in `seconds`, timed on a throwaway model (the real run is then seeded)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    tokens = torch.randint(0, len(tokenizer), (1 << 16,))
    quiet = replace(settings or TrainSettings(steps=0), log_every=10**9, max_seconds=None)
    per_step = _time_steps(
        lambda n: train_target(
            new_target(TargetShape(), tokenizer, seed),
            tokens,
            replace(quiet, steps=n),
            seed=seed,
            device=device,
            log=lambda _: None,
        )
    )
    return max(10, int(seconds / per_step))


def calibrate_drafter_steps(
    work: Path, seconds: float, device: str, seed: int, settings: DrafterSettings | None = None
) -> int:
    """Drafter steps that fit in `seconds` after the target's answers are generated (about a fifth)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_chat.train.data import corpus_sequences

    tokenizer = AutoTokenizer.from_pretrained(work / "target")
    target = AutoModelForCausalLM.from_pretrained(work / "target", dtype=torch.float32)
    target.to(torch.device(device))  # type: ignore[arg-type]  # transformers types `to`'s wrapper, not the model's
    sequences = corpus_sequences(tokenizer, load_corpus(work / "corpus.json").train[:256])
    shape = DrafterShape()
    mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    assert isinstance(mask_id, int)  # one token in, one id out
    config = drafter_config_dict(shape, target.config, mask_id)
    taught = teach_all(target, sequences, shape.target_layer_ids, device)  # once: the timed runs share it
    quiet = replace(settings or DrafterSettings(steps=0), log_every=10**9, max_seconds=None)
    per_step = _time_steps(
        lambda n: train_drafter(
            new_drafter(config, target, seed),
            target,
            sequences,
            replace(quiet, steps=n),
            seed=seed,
            device=device,
            log=lambda _: None,
            taught=taught,
        )
    )
    return max(10, int(0.8 * seconds / per_step))


def _time_steps(run) -> float:
    """Seconds per step: after a warm-up run, time 2 and 6 steps and take the difference (start-up cancels)."""
    run(1)
    t0 = time.perf_counter()
    run(2)
    t1 = time.perf_counter()
    run(6)
    t2 = time.perf_counter()
    per_step = ((t2 - t1) - (t1 - t0)) / 4
    return per_step if per_step > 0 else (t2 - t1) / 6
