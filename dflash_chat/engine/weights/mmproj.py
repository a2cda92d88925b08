"""Read a vision tower from a llama.cpp mmproj GGUF (`convert_hf_to_gguf.py --mmproj`) into HF names and config.

The converter writes Qwen3.5/3.6's tower as projector type `qwen3vl_merger` (docs/ARCHITECTURE.md, Facts: The
vision tower, mmproj layout): `clip.vision.*` hyperparameters, `v.*` tower tensors, `mm.0` / `mm.2` for the
merger's two matrices, and the Conv3d patch embed split into its two temporal halves (`v.patch_embd.weight` and
`v.patch_embd.weight.1`), which are stacked back here. Every tensor is handed out as floats (F32, F16 and BF16
as stored, Q8_0 decoded): the tower's linears carry biases, which the packed modules do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.limits import LIMITS
from dflash_chat.engine.weights.gguf import LazyTensors, check_types, raw_tensor
from dflash_chat.engine.weights.mmproj_header import PROJECTOR, read_mmproj_header
from dflash_chat.engine.weights.quant_tensor import QuantTensor

__all__ = ["PROJECTOR", "Mmproj", "gguf_names", "read_mmproj"]

# HF name (after `model.visual.`) -> GGUF name, per block and for the whole tower
BLOCK_NAMES = {
    "norm1": "ln1",
    "norm2": "ln2",
    "attn.qkv": "attn_qkv",
    "attn.proj": "attn_out",
    "mlp.linear_fc1": "ffn_up",
    "mlp.linear_fc2": "ffn_down",
}
TOWER_NAMES = {
    "patch_embed.proj.bias": "v.patch_embd.bias",
    "pos_embed.weight": "v.position_embd.weight",
    "merger.norm.weight": "v.post_ln.weight",
    "merger.norm.bias": "v.post_ln.bias",
    "merger.linear_fc1.weight": "mm.0.weight",
    "merger.linear_fc1.bias": "mm.0.bias",
    "merger.linear_fc2.weight": "mm.2.weight",
    "merger.linear_fc2.bias": "mm.2.bias",
}
PATCH_HALVES = ("v.patch_embd.weight", "v.patch_embd.weight.1")


@dataclass
class Mmproj:
    path: Path
    vision_config: dict  # HF `vision_config`, as VisionConfig.from_dict reads it
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    tensors: LazyTensors  # HF names after `model.visual.`


def gguf_names(depth: int) -> dict[str, str]:
    """Every HF tensor name of a tower of `depth` blocks -> its GGUF name (the patch embed's halves apart)."""
    out = dict(TOWER_NAMES)
    for i in range(depth):
        for hf, g in BLOCK_NAMES.items():
            for part in ("weight", "bias"):
                out[f"blocks.{i}.{hf}.{part}"] = f"v.blk.{i}.{g}.{part}"
    return out


def _float(record) -> torch.Tensor:
    """A tensor record as floats of its own shape (ne reversed; F32/F16/BF16 as stored, blocks decoded)."""
    t = raw_tensor(record)
    t = t.dequantize() if isinstance(t, QuantTensor) else t
    return t.reshape(tuple(int(d) for d in reversed(record.shape.tolist())))


def read_mmproj(path: str | Path) -> Mmproj:
    path = Path(path)
    header = read_mmproj_header(path)
    kv = header.fields
    check_types(path, header)
    by_name = {t.name: t for t in header.tensors}
    try:
        cfg = _vision_config(kv, by_name)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(f"{path}: mmproj GGUF lacks {exc}: the file is incomplete; download it again") from None
    if not 1 <= cfg["depth"] <= LIMITS["num_hidden_layers"]:
        raise ModelFormatError(
            f"{path}: mmproj GGUF has clip.vision.block_count {cfg['depth']}: the file is damaged; download it again"
        )
    missing = [g for g in (*gguf_names(cfg["depth"]).values(), *PATCH_HALVES) if g not in by_name]
    if missing:
        raise ModelFormatError(
            f"{path}: mmproj GGUF lacks tensors {', '.join(missing[:3])}: the file is incomplete or not Qwen3.5's "
            "tower; download it again"
        )
    return Mmproj(
        path,
        cfg,
        tuple(float(v) for v in kv.get("clip.vision.image_mean", (0.5, 0.5, 0.5))),
        tuple(float(v) for v in kv.get("clip.vision.image_std", (0.5, 0.5, 0.5))),
        LazyTensors(_loaders(cfg["depth"], by_name)),
    )


def _vision_config(kv: dict, by_name: dict) -> dict:
    """The HF vision_config the converter wrote from (the table's size from its tensor, as it is not a key)."""
    pos = by_name["v.position_embd.weight"]
    patch = by_name[PATCH_HALVES[0]]
    return {
        "depth": int(kv["clip.vision.block_count"]),
        "hidden_size": int(kv["clip.vision.embedding_length"]),
        "intermediate_size": int(kv["clip.vision.feed_forward_length"]),
        "num_heads": int(kv["clip.vision.attention.head_count"]),
        "patch_size": int(kv["clip.vision.patch_size"]),
        "spatial_merge_size": int(kv.get("clip.vision.spatial_merge_size", 2)),
        "temporal_patch_size": len(PATCH_HALVES),
        "in_channels": int(patch.shape[2]),  # ne: [P, P, C, hidden]
        "out_hidden_size": int(kv["clip.vision.projection_dim"]),
        "num_position_embeddings": int(pos.shape[1]),
        "deepstack_visual_indexes": [i for i, on in enumerate(kv.get("clip.vision.is_deepstack_layers") or []) if on],
    }


def _loaders(depth: int, by_name: dict) -> dict[str, Callable[[], Any]]:
    loaders: dict[str, Callable[[], Any]] = {hf: partial(_float, by_name[g]) for hf, g in gguf_names(depth).items()}
    halves = [by_name[g] for g in PATCH_HALVES]
    # [hidden, C, P, P] each -> the Conv3d's [hidden, C, 2, P, P]
    loaders["patch_embed.proj.weight"] = lambda: torch.stack([_float(t).float() for t in halves], dim=2)
    return loaders
