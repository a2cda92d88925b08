"""A prompt with images as the target reads it: each image's placeholder tokens take the vision tower's feature rows
as their embeddings, and every token gets an M-RoPE position (temporal, height, width) that the attention layers
rotate by (the Gated DeltaNet layers take no positions). Written from the facts of transformers' Qwen3.5
`get_rope_index` and text rotary (docs/ARCHITECTURE.md, Facts: The vision tower).

Text tokens have all three positions equal, so a prompt without images rotates exactly as plain RoPE does. An image
of llm grid (t, gh, gw) (its patch grid over the merge size) starting at position s puts token (i, j, k) at
(s + i, s + j, s + k); the text after it continues at s + max(gh, gw). So a prompt's last position is below its
length, and a token at sequence index n past the prompt rotates at n + `delta` in all three (delta <= 0): plain
RoPE at n + delta.

The chat template writes one placeholder per image (`<|vision_start|><|image_pad|><|vision_end|>`); `expand` repeats
each to its image's token count, as transformers' Qwen3VLProcessor does, and `build` makes the whole input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dflash_chat.engine.models.layers import Rotary
from dflash_chat.engine.models.vision import VisionTower, merged_tokens
from dflash_chat.engine.models.vision_input import Grid, preprocess


@dataclass(frozen=True)
class RopePositions:
    positions: torch.Tensor  # [3, T] int64: temporal, height, width
    delta: int  # a token at sequence index n after these rotates at n + delta


@dataclass(frozen=True)
class ImagePrompt:
    """What the target runs for a prompt with images: `TargetModel.forward(ids, state, embeds=, rope_positions=)`."""

    ids: torch.Tensor  # [T], each image's placeholders expanded
    embeds: torch.Tensor  # [T, H], the placeholders' rows the tower's features
    rope: RopePositions


def build(
    ids: Sequence[int],
    images: Sequence,
    tower: VisionTower,
    embed_tokens: nn.Module,
    image_token_id: int,
    start: int = 0,
    delta: int = 0,
) -> ImagePrompt:
    """The input of a prompt rendered with one placeholder per image, for Pillow `images` in their order; `start`
    and `delta` as `rope_positions` takes them, for a prompt that continues held tokens."""
    pixels, grids = preprocess(images, tower.images)
    expanded = torch.tensor(expand(ids, image_token_id, [merged_tokens(tower.cfg, g) for g in grids]))
    weight = next(embed_tokens.parameters())
    expanded = expanded.to(weight.device)
    embeds = splice(embed_tokens(expanded), expanded, image_token_id, tower(pixels, grids))
    rope = rope_positions(expanded, image_token_id, grids, tower.cfg.spatial_merge_size, start, delta)
    return ImagePrompt(expanded, embeds, rope)


def expand(ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> list[int]:
    """`ids` with the i-th image placeholder repeated counts[i] times."""
    placeholders = sum(1 for t in ids if t == image_token_id)
    if placeholders != len(counts):
        raise ValueError(f"the prompt holds {placeholders} image placeholders for {len(counts)} images")
    out: list[int] = []
    images = iter(counts)
    for t in ids:
        out.extend([t] * next(images) if t == image_token_id else [t])
    return out


def rope_positions(
    ids: Sequence[int] | torch.Tensor,
    image_token_id: int,
    grids: Sequence[Grid],
    merge: int,
    start: int = 0,
    delta: int = 0,
) -> RopePositions:
    """M-RoPE positions of `ids`, each run of image tokens taking the next grid's t * h * w / merge^2 tokens.
    `ids` begin at sequence index `start`, after tokens whose own delta was `delta` (0 when none held an image)."""
    tokens = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    parts: list[torch.Tensor] = []
    pos, i, images = start + delta, 0, iter(grids)
    while i < len(tokens):
        if tokens[i] != image_token_id:
            j = i
            while j < len(tokens) and tokens[j] != image_token_id:
                j += 1
            parts.append(torch.arange(pos, pos + j - i).expand(3, -1))
            pos, i = pos + j - i, j
            continue
        grid = next(images, None)
        if grid is None:
            raise ValueError("the prompt holds more image placeholders than there are images")
        t, gh, gw = grid[0], grid[1] // merge, grid[2] // merge
        n = t * gh * gw
        if tokens[i : i + n] != [image_token_id] * n:
            raise ValueError(f"an image of {n} tokens has a run of fewer placeholders in the prompt")
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")
        parts.append(torch.stack((tt, hh, ww)).reshape(3, -1) + pos)
        pos, i = pos + max(gh, gw), i + n
    if next(images, None) is not None:
        raise ValueError("there are more images than runs of image placeholders in the prompt")
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
    return RopePositions(positions, pos - start - len(tokens))


def mrope_axes(rotary_dim: int, section: Sequence[int]) -> torch.Tensor:
    """Which position (0 temporal, 1 height, 2 width) each of the rotary_dim / 2 frequencies reads: interleaved,
    frequency i reading height when i % 3 == 1 and i < 3 * section[1], width when i % 3 == 2 and i < 3 * section[2],
    else temporal."""
    half = rotary_dim // 2
    axes = torch.zeros(half, dtype=torch.long)
    for axis in (1, 2):
        axes[axis : 3 * section[axis] : 3] = axis
    return axes


def mrope_cos_sin(
    rotary: Rotary, positions: torch.Tensor, axes: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim] of M-RoPE positions [3, T]: what Rotary.cos_sin gives a plain position, each
    frequency taken from its axis's position."""
    inv_freq = rotary.inv_freq
    picked = positions.to(inv_freq.device).float().index_select(0, axes.to(inv_freq.device))  # [half, T]
    freqs = picked.T * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if rotary.attention_factor != 1.0:
        cos, sin = cos * rotary.attention_factor, sin * rotary.attention_factor
    return cos.to(dtype), sin.to(dtype)


def splice(embeds: torch.Tensor, ids: torch.Tensor, image_token_id: int, features: torch.Tensor) -> torch.Tensor:
    """`embeds` [T, H] with the rows of the image placeholder tokens replaced by `features`, in order."""
    where = (ids == image_token_id).nonzero().squeeze(-1)
    if where.shape[0] != features.shape[0]:
        raise ValueError(f"the prompt holds {where.shape[0]} image placeholders for {features.shape[0]} feature rows")
    out = embeds.clone()
    out[where] = features.to(out.dtype)
    return out
