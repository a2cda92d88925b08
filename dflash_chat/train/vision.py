"""The demo's vision tower, and the three tokens its images need in the demo tokenizer: the recipe's `vision` stage.

The tower is random: a Qwen3.5-shaped vision tower (patch 16, 2 x 2 merge, temporal patch 2, as the real ones) at a
tiny width, its weights drawn from a seeded generator, so `serve --demo` and the chat's demo can take images and
every part of the path runs (decoding, preprocessing, the tower, the features spliced into the prompt, M-RoPE,
prefix reuse by content). It sees nothing meaningful: the demo target was never trained on its features. It ships
as a Hugging Face folder (`config.json` with `vision_config`, `preprocessor_config.json` with a small pixel budget,
`visual.*` tensors in `model.safetensors`), which engine/load.py reads as it reads a model folder's tower.

The demo tokenizer has no spare id (its vocabulary fills the target's embedding), so its vision tokens take the ids
of the byte-level BPE's bytes 0xFD, 0xFE and 0xFF: bytes that UTF-8 text never holds, so no text encodes differently
and the target's weights stay as they are. The chat template (train/tokenizer.py) writes an image part as Qwen3.5's
does, `<|vision_start|><|image_pad|><|vision_end|>`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dflash_chat.engine.end_tokens import IMAGE_PAD
from dflash_chat.train.common import Log

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
# token -> the byte whose id it takes (bytes no UTF-8 text holds)
VISION_TOKENS = {VISION_START: 0xFD, VISION_END: 0xFE, IMAGE_PAD: 0xFF}
VISION_CONFIG = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 64,
}
# 64 x 64 to 256 x 256 pixels: an image takes 4 to 64 of the demo's context tokens
PREPROCESSOR = {
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "size": {"shortest_edge": 64 * 64, "longest_edge": 256 * 256},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
FEATURE_RMS = 0.03  # about the demo target's token embeddings' (0.032), so an image's rows read like token rows


def vision_stage(out: Path, seed: int = 0, log: Log = print) -> Path:
    """The shipped demo target in `out` given the vision tokens (and the chat template that writes them), and its
    tower written to `out`/vision."""
    from dflash_chat.train.tokenizer import CHAT_TEMPLATE

    target = out / "target"
    add_vision_tokens(target)
    (target / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    hidden = json.loads((target / "config.json").read_text())["hidden_size"]
    folder = write_demo_tower(out / "vision", hidden, seed)
    size = sum(p.stat().st_size for p in folder.iterdir())
    log(f"wrote the demo's random vision tower to {folder} ({size // 1024} KiB) and the vision tokens to {target}")
    return folder


def write_demo_tower(folder: Path, out_hidden: int, seed: int = 0) -> Path:
    """A random vision tower of VISION_CONFIG giving `out_hidden`-wide features, as a Hugging Face folder."""
    import torch
    from safetensors.torch import save_file

    from dflash_chat.engine.models.vision import VisionConfig, VisionTower

    config = {**VISION_CONFIG, "out_hidden_size": out_hidden}
    tower = VisionTower(VisionConfig.from_dict(config))
    gen = torch.Generator().manual_seed(seed)
    weights = {name: _drawn(name, t, gen) for name, t in tower.state_dict().items()}
    tower.load_state_dict(weights)
    scale = FEATURE_RMS / _feature_rms(tower)
    for name in ("merger.linear_fc2.weight", "merger.linear_fc2.bias"):
        weights[name] = weights[name] * scale
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"visual.{name}": t.to(torch.bfloat16).contiguous() for name, t in weights.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"vision_config": config}, indent=2) + "\n")
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    return folder


def _drawn(name: str, like, gen):
    """A tensor for `name`: LayerNorms as initialised (1, 0), the rest normal with 1 / sqrt(fan-in)."""
    import torch

    if ".norm" in name or name.startswith("norm") or "merger.norm" in name:
        return torch.ones_like(like) if name.endswith("weight") else torch.zeros_like(like)
    if like.dim() == 1:
        return torch.randn(like.shape, generator=gen) * 0.02
    fan_in = like[0].numel()
    return torch.randn(like.shape, generator=gen) / math.sqrt(fan_in)


def _feature_rms(tower) -> float:
    """The RMS of the tower's features for a fixed grey gradient image."""
    import numpy as np
    import torch
    from PIL import Image

    from dflash_chat.engine.models.vision_input import ImageConfig, preprocess

    ramp = np.tile(np.linspace(0, 255, 128, dtype=np.uint8), (128, 1))
    image = Image.fromarray(np.stack([ramp, ramp.T, 255 - ramp], axis=-1))
    pixels, grids = preprocess([image], ImageConfig.from_dict(PREPROCESSOR))
    with torch.no_grad():
        return float(tower(pixels, grids).pow(2).mean().sqrt())


def add_vision_tokens(folder: Path) -> None:
    """The tokenizer in `folder` given VISION_TOKENS at their bytes' ids (done once: a tokenizer that has them is
    left as it is); ValueError when a byte's token is not whole in the vocabulary or some merge uses it."""
    path = Path(folder) / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab, added = data["model"]["vocab"], data["added_tokens"]
    if all(token in vocab for token in VISION_TOKENS):
        return
    alphabet = _byte_alphabet()
    merged = {part for merge in data["model"]["merges"] for part in _parts(merge)}
    for token, byte in VISION_TOKENS.items():
        char = alphabet[byte]
        if char not in vocab or any(char in part for part in merged):
            raise ValueError(f"byte 0x{byte:02X} is not a token of its own in {path}: it cannot hold {token}")
        index = vocab.pop(char)
        vocab[token] = index
        added.append(
            {
                "id": index,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    added.sort(key=lambda entry: entry["id"])
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    config_path = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    specials = config.setdefault("extra_special_tokens", [])
    specials.extend(token for token in VISION_TOKENS if token not in specials)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _parts(merge) -> list[str]:
    return merge.split(" ") if isinstance(merge, str) else list(merge)


def _byte_alphabet() -> dict[int, str]:
    """Byte -> the character byte-level BPE writes it as (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table
