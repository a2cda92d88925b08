"""The demo target: a tiny Qwen3.5-architecture model (Gated DeltaNet + gated attention), trained with
transformers' own `Qwen3_5ForCausalLM` and saved as a standard HF checkpoint."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from dflash_chat.train.common import Log, Schedule, autocast_for, run_steps, seeded


@dataclass
class TargetShape:
    hidden_size: int = 256
    intermediate_size: int = 768
    layer_types: tuple[str, ...] = (
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
        "linear_attention",
        "full_attention",
    )
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_head_dim: int = 64
    max_position_embeddings: int = 4096


def target_config(shape: TargetShape, tokenizer):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=len(shape.layer_types),
        layer_types=list(shape.layer_types),
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        linear_num_key_heads=shape.linear_num_key_heads,
        linear_num_value_heads=shape.linear_num_value_heads,
        linear_key_head_dim=shape.linear_head_dim,
        linear_value_head_dim=shape.linear_head_dim,
        linear_conv_kernel_dim=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        architectures=["Qwen3_5ForCausalLM"],
    )


def new_target(shape: TargetShape, tokenizer, seed: int):
    from transformers import Qwen3_5ForCausalLM

    with seeded(seed):
        return Qwen3_5ForCausalLM(target_config(shape, tokenizer))


@dataclass
class TrainSettings(Schedule):
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.1
    batch_size: int = 16
    seq_len: int = 256


def train_target(
    model, tokens: torch.Tensor, settings: TrainSettings, *, seed: int, device: str = "cpu", log: Log = print
) -> list[float]:
    """Next-token training on random windows of the packed token stream; returns the loss per step."""
    model.to(device).train()
    gen = torch.Generator().manual_seed(seed)

    def step(_: int):
        batch = random_windows(tokens, settings.batch_size, settings.seq_len, gen).to(device)
        with autocast_for(device):
            return model(input_ids=batch, labels=batch).loss, {}

    losses = run_steps("target", model.parameters(), settings, step, log)
    model.eval()
    return losses


class Chat(NamedTuple):
    """A chat's token ids, and what the target learns of it: the ids on its answers, -100 elsewhere."""

    ids: torch.Tensor
    labels: torch.Tensor


@dataclass
class MixedSettings(TrainSettings):
    """`train_target_mixed`'s: `batch_size` windows of `seq_len` tokens of the packed stream and `chat_batch`
    whole chats each step."""

    chat_batch: int = 4


def train_target_mixed(
    model,
    chats: list[Chat],
    tokens: torch.Tensor,
    settings: MixedSettings,
    *,
    pad_id: int,
    seed: int,
    device: str = "cpu",
    log: Log = print,
    checked: Sequence[Chat] = (),
    check_every: int = 0,
) -> list[float]:
    """Next-token training on two batches a step, their losses added: `chat_batch` whole chats (right-padded),
    the loss on their answers alone, and random windows of the packed stream
    `tokens`, the loss on every token (what the target first trained on, so it keeps it). Every `check_every`
    steps (0: never), logs `answers_right` on the `checked` chats. Returns the loss per step."""
    model.to(device).train()
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)

    def step(done: int):
        if check_every and checked and done and done % check_every == 0:
            tokens_right, whole = answers_right(model, checked, pad_id, device)
            log(
                f"target step {done}: held-out answers, teacher-forced: {tokens_right:.1%} of tokens, {whole:.0%} whole"
            )
            model.train()
        picked = [chats[i] for i in rng.sample(range(len(chats)), min(settings.chat_batch, len(chats)))]
        ids, labels = answer_batch(picked, pad_id)
        windows = random_windows(tokens, settings.batch_size, settings.seq_len, gen).to(device)
        with autocast_for(device):
            on_chats = model(input_ids=ids.to(device), labels=labels.to(device)).loss
            on_text = model(input_ids=windows, labels=windows).loss
        return on_chats + on_text, {"chats": on_chats.detach(), "text": on_text.detach()}

    losses = run_steps("target", model.parameters(), settings, step, log)
    model.eval()
    return losses


def answers_right(model, chats: Sequence[Chat], pad_id: int, device: str = "cpu") -> tuple[float, float]:
    """Teacher-forced, on `chats`' answers: the share of their tokens the model ranks first, and the share of
    chats whose every answer token it ranks first (those its greedy decoding writes exactly)."""
    hits = answer_hits(model, chats, pad_id, device)
    return hits.right_tokens / max(1, hits.tokens), hits.right_chats / max(1, hits.chats)


class Hits(NamedTuple):
    """Teacher-forced counts on chats' answers: their tokens and those ranked first, the chats and those
    whose every answer token is ranked first."""

    tokens: int
    right_tokens: int
    chats: int
    right_chats: int


@torch.no_grad()
def answer_hits(model, chats: Sequence[Chat], pad_id: int, device: str = "cpu", chunk: int = 8) -> Hits:
    """`Hits` on `chats`, `chunk` chats a forward pass (their logits over the vocabulary are the memory)."""
    model.eval()
    counts = [0, 0, 0, 0]
    for start in range(0, len(chats), chunk):
        ids, labels = answer_batch(chats[start : start + chunk], pad_id)
        logits = model(input_ids=ids.to(device)).logits[:, :-1].float().cpu()
        wanted = labels[:, 1:]
        scored = wanted != -100
        hit = (logits.argmax(-1) == wanted) | ~scored
        for k, n in enumerate((scored.sum(), hit[scored].sum(), len(ids), hit.all(-1).sum())):
            counts[k] += int(n)
    return Hits(*counts)


def answer_batch(chats: Sequence[Chat], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels) [N, longest]: the chats right-padded with `pad_id` (labels -100 there); the model
    shifts the labels itself."""
    width = max(len(c.ids) for c in chats)
    ids = torch.full((len(chats), width), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    for row, chat in enumerate(chats):
        ids[row, : len(chat.ids)] = chat.ids
        labels[row, : len(chat.labels)] = chat.labels
    return ids, labels


def random_windows(tokens: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - seq_len, (batch,), generator=gen)
    return torch.stack([tokens[s : s + seq_len] for s in starts.tolist()])


def save_target(model, tokenizer, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to("cpu", dtype=dtype).save_pretrained(out_dir, safe_serialization=True)
    model.to(torch.float32)
    tokenizer.save_pretrained(out_dir)
