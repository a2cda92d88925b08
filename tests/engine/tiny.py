"""Tiny random pairs for tests: the bench's tiny target (`dflash-chat bench` builds it too) and a random DFlash
drafter for it, written z-lab style (config.json + safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash_chat.bench.tiny_target import CHAT_TEMPLATE, SPECIAL_TOKENS, target_config, write_target, write_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "drafter_config",
    "target_config",
    "write_drafter",
    "write_pair",
    "write_target",
    "write_tokenizer",
]


def drafter_config(
    target_cfg: dict,
    *,
    layers: int = 2,
    block_size: int = 16,
    taps: list[int] | None = None,
    layer_types: list[str] | None = None,
    sliding_window: int = 8,
    schema: str = "new",
    dflash2: bool = False,
) -> dict:
    """A tiny drafter's config.json; `dflash2`: a DFlash2DraftModel (convolutions and a candidate selector,
    every layer bidirectional as z-lab's Qwen3.8-27B drafter declares)."""
    n = target_cfg["num_hidden_layers"]
    taps = taps if taps is not None else sorted({1 % n, n - 2 if n > 2 else 0})
    layer_types = layer_types or ["sliding_attention"] * (layers - 1) + ["full_attention"]
    hidden = target_cfg["hidden_size"]
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": target_cfg["vocab_size"],
        "num_target_layers": n,
        "layer_types": layer_types,
        "sliding_window": sliding_window,
        "use_sliding_window": "sliding_attention" in layer_types,
    }
    mask_id = SPECIAL_TOKENS.index("<|mask|>")  # its id in write_tokenizer's vocabulary
    if schema == "new":
        cfg["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
        cfg["dflash_config"] = {"block_size": block_size, "mask_token_id": mask_id, "target_layer_ids": taps}
    else:
        cfg["rope_theta"] = 10000.0
        cfg["block_size"] = block_size
        cfg["dflash_config"] = {"mask_token_id": mask_id, "target_layer_ids": taps}
    if dflash2:
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg["is_causal"] = False
        cfg["dflash_config"].update(
            {"conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 8, "selector_top_k": 4}
        )
    return cfg


def write_drafter(directory: Path, target_dir: Path, *, seed: int = 0, **kwargs) -> dict:
    """A random DFlash drafter for the target in `target_dir`, z-lab style. Returns its config."""
    from safetensors.torch import save_file

    from dflash_chat.engine.models.config import DrafterConfig
    from dflash_chat.engine.models.dflash2 import build_drafter

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target_cfg = json.loads((Path(target_dir) / "config.json").read_text())
    cfg = drafter_config(target_cfg, **kwargs)
    torch.manual_seed(seed)
    drafter = build_drafter(DrafterConfig.from_dict(cfg), target_cfg["hidden_size"], target_cfg["vocab_size"])
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("base_kernel"):  # [2, taps, H]: near the identity (tap 0 ~ 1), like trained ones
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
                p[:, 0] += 1.0
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    save_file({k: v.contiguous() for k, v in drafter.state_dict().items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def write_pair(root: Path, arch: str = "qwen3_5", *, seed: int = 0, **target_kwargs) -> tuple[Path, Path]:
    root = Path(root)
    target, drafter = root / "target", root / "drafter"
    write_target(target, arch, seed=seed, **target_kwargs)
    write_drafter(drafter, target, seed=seed)
    return target, drafter
