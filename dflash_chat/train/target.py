"""The demo target: a tiny Qwen3.5-architecture model (Gated DeltaNet + gated attention), trained with
transformers' own `Qwen3_5ForCausalLM` and saved as a standard HF checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def random_windows(tokens: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - seq_len, (batch,), generator=gen)
    return torch.stack([tokens[s : s + seq_len] for s in starts.tolist()])


def save_target(model, tokenizer, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to("cpu", dtype=dtype).save_pretrained(out_dir, safe_serialization=True)
    model.to(torch.float32)
    tokenizer.save_pretrained(out_dir)
