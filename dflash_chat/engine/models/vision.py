"""The vision tower of Qwen3.5/3.6/3.8 (`model.visual.*`): image patches in, one feature row per merged patch out.

One file, read top to bottom, written from the facts of transformers' `Qwen3_5VisionModel` (docs/ARCHITECTURE.md,
Facts: The vision tower). Parameter names follow the HF checkpoints with `model.visual.` taken off, so their
safetensors load directly; an mmproj GGUF is mapped to the same names (engine/weights/mmproj.py).

The input is what engine/models/vision_input.py makes of the images: `pixels` [N, C * T * P * P], one row per
patch (channels, then the two temporal frames, then the P x P pixels), the patches of each image in merge-block
order (each 2 x 2 block of neighbouring patches consecutive, blocks row by row), and each image's grid (t, h, w)
in patches. The output is [sum of t * h * w / merge^2, out_hidden]: the rows that replace the image's placeholder
tokens in the target's prompt, in order.

- patch embed: a Conv3d whose kernel equals its stride, i.e. one matrix over each patch row;
- a learned square table of position embeddings, resampled bilinearly (corners aligned) to each image's grid;
- blocks: LayerNorm, attention with a 2-D rotary (a quarter of each head's frequencies from the patch's row, a
  quarter from its column, rotate-half over the whole head) within one frame of one image, LayerNorm, GELU (tanh) MLP;
- the merger: LayerNorm, then each 2 x 2 block's four rows side by side, fc1, GELU (erf), fc2 to the text width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.limits import DEFAULT_LIMIT, LIMITS
from dflash_chat.engine.models.vision_input import Grid, ImageConfig


@dataclass(frozen=True)
class VisionConfig:
    """A checkpoint's `vision_config` (transformers' Qwen3_5VisionConfig defaults where a key is absent)."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    rope_theta: float = 10000.0
    eps: float = 1e-6  # every LayerNorm of the tower (transformers hard-codes it)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_values(self) -> int:
        """Values in one patch row of `pixels`."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def grid_side(self) -> int:
        """Side of the square table of learned position embeddings."""
        return int(self.num_position_embeddings**0.5)

    @classmethod
    def from_dict(cls, d: dict) -> VisionConfig:
        defaults = cls()
        sizes = {
            key: _size(d, key, getattr(defaults, key))
            for key in (
                "depth",
                "hidden_size",
                "intermediate_size",
                "num_heads",
                "in_channels",
                "patch_size",
                "spatial_merge_size",
                "temporal_patch_size",
                "out_hidden_size",
                "num_position_embeddings",
            )
        }
        if d.get("deepstack_visual_indexes"):
            raise ModelFormatError(
                "vision_config has deepstack layers (Qwen3-VL's tower); dflash-chat runs Qwen3.5/3.6's, which has none"
            )
        rope = d.get("rope_parameters") or {}
        cfg = cls(**sizes, rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))))
        if cfg.hidden_size % cfg.num_heads or cfg.head_dim % 4:
            raise ModelFormatError(
                f"vision_config: hidden_size {cfg.hidden_size} over {cfg.num_heads} heads does not give a head width "
                "that is a multiple of 4: the file is damaged or not a supported model"
            )
        if cfg.grid_side**2 != cfg.num_position_embeddings:
            raise ModelFormatError(
                f"vision_config: num_position_embeddings {cfg.num_position_embeddings} is not a square: the file "
                "is damaged or not a supported model"
            )
        return cfg


def _size(d: dict, key: str, default: int) -> int:
    value = d.get(key, default)
    limit = LIMITS.get(key, DEFAULT_LIMIT)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ModelFormatError(
            f"vision_config has {key} = {value!r}, expected a whole number from 1 to {limit}: the file is damaged "
            "or not a supported model"
        )
    return value


class PatchEmbed(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        return F.linear(pixels.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: list[int]) -> torch.Tensor:
        """x [N, hidden]; `frames` the patch count of each frame, in order (attention stays inside one)."""
        N = x.shape[0]
        q, k, v = self.qkv(x).view(N, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = [
            F.scaled_dot_product_attention(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None])
            for qi, ki, vi in zip(q.split(frames), k.split(frames), v.split(frames), strict=True)
        ]
        return self.proj(torch.cat([o[0].transpose(0, 1) for o in out]).reshape(N, -1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the whole head, in float32 as the reference does. x [N, heads, d]; cos/sin [N, d]."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.eps)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.eps)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, frames)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.merged = cfg.hidden_size * cfg.spatial_merge_size**2
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.eps)
        self.linear_fc1 = nn.Linear(self.merged, self.merged, bias=True)
        self.linear_fc2 = nn.Linear(self.merged, cfg.out_hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).view(-1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)
        # how images are made into this tower's input (the loader sets the checkpoint's budget, mean and std)
        self.images = ImageConfig(cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size)

    @property
    def vision_blocks(self) -> Sequence[VisionBlock]:
        return cast("Sequence[VisionBlock]", self.blocks)

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        """Features [sum of t * h * w / merge^2, out_hidden] for the patches of the images of `grids`, in order."""
        cfg = self.cfg
        check_grids(cfg, pixels, grids)
        device = self.pos_embed.weight.device
        x = self.patch_embed(pixels.to(device))
        x = x + self.position_embeddings(grids).to(x.dtype)
        cos, sin = self.rotary(grids)
        frames = [h * w for t, h, w in grids for _ in range(t)]
        for block in self.vision_blocks:
            x = block(x, cos, sin, frames)
        return self.merger(x)

    def position_embeddings(self, grids: Sequence[Grid]) -> torch.Tensor:
        """The learned table resampled to each grid: bilinear with corners aligned, each patch a weighted sum of
        its four nearest table rows; rows in merge-block order, repeated for each frame."""
        side, table = self.cfg.grid_side, self.pos_embed.weight
        out = []
        for t, h, w in grids:
            rows, cols = self.merge_order(h, w)
            r_taps, r_weights = _taps(rows, h, side)
            c_taps, c_weights = _taps(cols, w, side)
            index = (r_taps[:, :, None] * side + c_taps[:, None, :]).reshape(-1, 4)
            weight = (r_weights[:, :, None] * c_weights[:, None, :]).reshape(-1, 4)
            embedded = (table[index] * weight[:, :, None]).sum(1)  # in float32 (the weights'), as the reference
            out.append(embedded.repeat(t, 1))
        return torch.cat(out)

    def rotary(self, grids: Sequence[Grid]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, head_dim] (float32) of each patch's (row, column) in its image."""
        d = self.cfg.head_dim
        quarter = torch.arange(0, d // 2, 2, dtype=torch.float, device=self.pos_embed.weight.device)
        inv_freq = 1.0 / (self.cfg.rope_theta ** (quarter / (d // 2)))
        freqs = []
        for t, h, w in grids:
            rows, cols = self.merge_order(h, w)
            f = torch.cat((rows.float()[:, None] * inv_freq, cols.float()[:, None] * inv_freq), dim=-1)
            freqs.append(f.repeat(t, 1))
        emb = torch.cat(freqs)
        emb = torch.cat((emb, emb), dim=-1)
        return emb.cos(), emb.sin()

    def merge_order(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of each patch of an h x w grid in merge-block order."""
        m = self.cfg.spatial_merge_size
        device = self.pos_embed.weight.device
        rows = torch.arange(h, device=device)[:, None].expand(h, w)
        cols = torch.arange(w, device=device)[None, :].expand(h, w)
        blocks = (h // m, m, w // m, m)
        return rows.reshape(blocks).transpose(1, 2).reshape(-1), cols.reshape(blocks).transpose(1, 2).reshape(-1)


def _taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two table rows (clamped to the table) and weights that a grid coordinate in [0, size) samples, corners
    aligned: coordinate 0 on row 0 and size - 1 on row side - 1."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    offsets = torch.arange(2, device=index.device)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def check_grids(cfg: VisionConfig, pixels: torch.Tensor, grids: Sequence[Grid]) -> None:
    """Grids whose patches add up to the pixel rows, each side a whole number of merge blocks."""
    m = cfg.spatial_merge_size
    if any(t < 1 or h < 1 or w < 1 or h % m or w % m for t, h, w in grids):
        raise ValueError(f"image grids {list(grids)} are not whole {m} x {m} blocks of patches")
    rows = sum(t * h * w for t, h, w in grids)
    if pixels.dim() != 2 or pixels.shape != (rows, cfg.patch_values):
        raise ValueError(
            f"pixels of shape {tuple(pixels.shape)} do not hold the grids' {rows} patches of {cfg.patch_values} values"
        )


def merged_tokens(cfg: VisionConfig, grid: Grid) -> int:
    """Placeholder tokens (feature rows) of an image of `grid`."""
    t, h, w = grid
    return t * h * w // cfg.spatial_merge_size**2
