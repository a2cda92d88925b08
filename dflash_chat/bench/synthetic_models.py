"""Models of the real shapes with random weights, generated directly in packed form, for benchmarks.

`dflash-chat bench --synthetic qwen3.6-27b` measures the engine at the shapes users run without
downloading or quantizing anything: every weight is random blocks of the chosen format made on the
device in seconds (the scales set to small finite values), laid out as the quant mix of a llama.cpp
file (a Q4_K_M file is mostly Q4_K with Q6_K for the output and for attn_v/attn_qkv and ffn_down in
about a third of the layers). The numbers the model computes are meaningless; the bytes it reads and
the work it does per step are those of the real model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dflash_chat.engine.ggml.formats import FORMATS, Format
from dflash_chat.engine.models.config import DrafterConfig, TargetConfig
from dflash_chat.engine.models.dflash import DFlashDrafter
from dflash_chat.engine.models.dflash2 import CandidateSelector
from dflash_chat.engine.models.dflash2 import build_drafter as make_drafter
from dflash_chat.engine.models.fused import fuse_projections
from dflash_chat.engine.models.layers import Experts, Rotary
from dflash_chat.engine.models.mtp import MTPHead
from dflash_chat.engine.models.target import TargetModel
from dflash_chat.engine.models.vision import VisionConfig, VisionTower
from dflash_chat.engine.weights.quant_tensor import QuantTensor

# The published configs (text part) of the targets and their DFlash drafters; what a family shares is written once.
_QWEN36_TEXT: dict[str, Any] = dict(  # both Qwen3.6 targets: vocabulary, rope, heads and the GDN/attention mix
    vocab_size=248320,
    head_dim=256,
    rms_norm_eps=1e-6,
    rope_theta=10_000_000,
    partial_rotary_factor=0.25,
    full_attention_interval=4,
    linear_num_key_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    max_position_embeddings=262144,
    eos_token_id=248046,
)
TARGETS: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": dict(
        _QWEN36_TEXT,
        model_type="qwen3_5_text",
        hidden_size=5120,
        num_hidden_layers=64,
        num_attention_heads=24,
        num_key_value_heads=4,
        intermediate_size=17408,
        linear_num_value_heads=48,
    ),
    "qwen3.6-35b-a3b": dict(
        _QWEN36_TEXT,
        model_type="qwen3_5_moe_text",
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        linear_num_value_heads=32,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    ),
}
TARGETS["qwen3.8-27b"] = dict(TARGETS["qwen3.6-27b"])  # a qwen3_5 target with Qwen3.6-27B's shapes
_DRAFTER: dict[str, Any] = dict(  # every drafter here: a Qwen3 stack of 32 heads of 128 with sliding windows
    model_type="qwen3",
    num_attention_heads=32,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=10_000_000,
    use_sliding_window=True,
)
_DRAFTER_27B: dict[str, Any] = dict(  # the 27B targets' drafters
    _DRAFTER,
    hidden_size=5120,
    intermediate_size=17408,
    num_hidden_layers=5,
    num_key_value_heads=8,
    sliding_window=2048,
)
DRAFTERS: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": dict(
        _DRAFTER_27B,
        architectures=["DFlashDraftModel"],
        block_size=16,
        layer_types=["sliding_attention"] * 4 + ["full_attention"],
        dflash_config=dict(mask_token_id=248070, target_layer_ids=[1, 16, 31, 46, 61]),
    ),
    "qwen3.6-35b-a3b": dict(
        _DRAFTER,
        architectures=["DFlashDraftModel"],
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=6,
        num_key_value_heads=4,
        sliding_window=4096,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        dflash_config=dict(block_size=16, mask_token_id=248077, target_layer_ids=[1, 6, 11, 16, 22, 27, 32, 37]),
    ),
    "qwen3.8-27b": dict(  # z-lab/Qwen3.8-27B-DFlash2
        _DRAFTER_27B,
        architectures=["DFlash2DraftModel"],
        is_causal=False,
        layer_types=["sliding_attention"] * 5,
        dflash_config=dict(
            block_size=8,
            mask_token_id=248070,
            target_layer_ids=[5, 19, 33, 47, 61],
            conv_group_size=16,
            conv_kernel_size=2,
            selector_rank=256,
            selector_top_k=16,
        ),
    ),
}
# Every target's vision tower is Qwen3.5's (its published vision_config; the catalog's `target.vision`), its features
# as wide as the target's hidden size.
VISION: dict[str, dict[str, Any]] = {
    name: dict(
        depth=27,
        hidden_size=1152,
        intermediate_size=4304,
        num_heads=16,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=2304,
        out_hidden_size=target["hidden_size"],
    )
    for name, target in TARGETS.items()
}
MIXES = ("Q4_K_M", "Q8_0", "bf16")
TILE = 1_048_573  # random values drawn for a large float weight, repeated over it (a prime: random_uniform)

# bytes of each format's fp16 scale fields inside a block (random bits there could be inf or NaN)
_SCALE_AT = {"Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def target_config(name: str, layers: int | None = None) -> TargetConfig:
    """The target's config, optionally cut to `layers` layers: one full-attention layer in four, and at
    least one (a cut hybrid keeps both kinds of layer)."""
    raw = dict(_known(TARGETS, name))
    if layers:
        interval = raw.get("full_attention_interval", 4)
        raw["num_hidden_layers"] = layers
        raw["layer_types"] = [
            "full_attention"
            if (i + 1) % interval == 0 or (layers < interval and i == layers - 1)
            else "linear_attention"
            for i in range(layers)
        ]
    return TargetConfig.from_dict(raw)


def drafter_config(name: str, target_layers: int, vocab: int | None = None) -> DrafterConfig:
    """The drafter's config; with a cut target its taps are spread over the layers that remain (and it
    keeps no more layers than the target), and with a cut vocabulary its mask token is the last id."""
    raw = dict(_known(DRAFTERS, name))
    if target_layers < raw["num_hidden_layers"]:  # a cut target for a CPU run: cut the drafter alike
        raw["num_hidden_layers"] = target_layers
        raw["layer_types"] = raw["layer_types"][-target_layers:]
    if vocab is not None and raw["dflash_config"]["mask_token_id"] >= vocab:
        raw["dflash_config"] = {**raw["dflash_config"], "mask_token_id": vocab - 1}
    full = TARGETS[name]["num_hidden_layers"]
    taps = raw["dflash_config"]["target_layer_ids"]
    if target_layers < full:
        taps = sorted({min(target_layers - 1, t * target_layers // full) for t in taps})
        raw["dflash_config"] = {**raw["dflash_config"], "target_layer_ids": taps}
    return DrafterConfig.from_dict(raw)


def vision_config(name: str, target_layers: int | None = None) -> VisionConfig:
    """The target's vision tower; with a cut target, cut in proportion to its layers (at least one block)."""
    raw = dict(_known(VISION, name))
    full = TARGETS[name]["num_hidden_layers"]
    if target_layers and target_layers < full:
        raw["depth"] = max(1, round(raw["depth"] * target_layers / full))
    return VisionConfig.from_dict(raw)


def _known(table: dict, name: str) -> dict:
    if name not in table:
        raise ValueError(f"no synthetic shapes for {name!r}; known: {', '.join(table)}")
    return table[name]


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def weight_format(name: str, shape: tuple[int, ...], mix: str, layers: int) -> Format | None:
    """The format a `mix` file stores HF weight `name` in; None: a float tensor (norms, conv, gates, router)."""
    matrix = (
        len(shape) >= 2
        and shape[-2] > 1
        and "conv1d" not in name
        and not name.endswith("mlp.gate.weight")
        and "codebook" not in name
        and not name.endswith("base_kernel")
    )
    if mix == "bf16" or not matrix:
        return None
    if mix == "Q8_0" or shape[-1] % 256:  # K-quant rows hold whole 256-value blocks; others fall back
        return FORMATS["Q8_0"]
    if name == "lm_head.weight":
        return FORMATS["Q6_K"]
    layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
    bumped = any(part in name for part in ("v_proj", "in_proj_qkv", "down_proj")) and "shared_expert" not in name
    return FORMATS["Q6_K"] if layer >= 0 and bumped and _more_bits(layer, layers) else FORMATS["Q4_K"]


def random_packed(fmt: Format, shape: tuple[int, ...], device, generator: torch.Generator) -> QuantTensor:
    """Random blocks of `fmt` holding a float tensor of `shape`; scales ~1e-4, so values stay small and finite."""
    rows = 1
    for s in shape[:-1]:
        rows *= s
    blocks = shape[-1] // fmt.block_size
    data = torch.randint(0, 256, (rows * blocks, fmt.type_size), dtype=torch.uint8, device=device, generator=generator)
    for at in _SCALE_AT[fmt.name]:
        scale = (torch.rand(rows * blocks, device=device, generator=generator) * 1e-4 + 5e-5).half()
        data[:, at : at + 2] = scale.view(torch.uint8).view(-1, 2)
    return QuantTensor(data.view(*shape[:-1], -1), fmt, shape)


def random_uniform(shape: tuple[int, ...], bound: float, device, generator: torch.Generator) -> torch.Tensor:
    """Uniform values in (-bound, bound): drawn for a small tensor; for a large one, TILE values drawn once and
    repeated over it. Random weights at real shapes were most of a CPU run's build (a 27B layer's 0.4 billion
    values at ~0.1 billion draws a second on one core); a copy goes at memory speed, and TILE is prime and above
    any row's length, so no two rows (nor columns) of a matrix hold the same values."""
    count = math.prod(shape)
    if count <= 4 * TILE:
        return torch.empty(shape, device=device).uniform_(-bound, bound, generator=generator)
    tile = torch.empty(TILE, device=device).uniform_(-bound, bound, generator=generator)
    out = torch.empty(count, device=device)
    whole = count // TILE
    out[: whole * TILE].view(whole, TILE).copy_(tile.expand(whole, TILE))
    out[whole * TILE :].copy_(tile[: count - whole * TILE])
    return out.view(shape)


class SyntheticWeights(Mapping):
    """HF name -> a random weight for every parameter of a meta-device model, made when asked for."""

    def __init__(self, model: nn.Module, mix: str, layers: int, device, seed: int = 0):
        self.shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        self.mix, self.layers, self.device = mix, layers, torch.device(device)
        self.generator = torch.Generator(self.device).manual_seed(seed)

    def __getitem__(self, name: str):
        shape = self.shapes[name]
        fmt = weight_format(name, shape, self.mix, self.layers)
        if fmt is not None:
            return random_packed(fmt, shape, self.device, self.generator)
        # uniform with the normal's spread (sd = bound / sqrt(3))
        bound = (0.02 if len(shape) > 1 else 0.1) * 3**0.5
        return random_uniform(shape, bound, self.device, self.generator)

    def __contains__(self, name: object) -> bool:
        return name in self.shapes

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def build_target(
    name: str, mix: str = "Q4_K_M", layers: int | None = None, device="cpu", dtype=torch.float32
) -> TargetModel:
    from dflash_chat.engine.checkpoint import materialise

    if mix not in MIXES:
        raise ValueError(f"unknown quant mix {mix!r}; known: {', '.join(MIXES)}")
    cfg = target_config(name, layers)
    with torch.device("meta"):
        model = TargetModel(cfg)
    materialise(model, SyntheticWeights(model, mix, cfg.num_layers, device), device, dtype, "synthetic target")
    model.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta).to(device)
    fuse_projections(model)
    return model.eval()


def build_drafter(name: str, target: TargetModel, mix: str = "Q8_0") -> DFlashDrafter:
    from dflash_chat.engine.checkpoint import materialise

    cfg = drafter_config(name, target.cfg.num_layers, target.cfg.vocab_size)
    p = target.model.norm.weight
    with torch.device("meta"):
        drafter = make_drafter(cfg, target.cfg.hidden_size, target.cfg.vocab_size)
    materialise(
        drafter,
        SyntheticWeights(drafter, mix, cfg.num_layers, p.device, seed=1),
        p.device,
        p.dtype,
        "synthetic drafter",
    )
    drafter.rotary = Rotary(cfg.head_dim, cfg.rope_theta).to(p.device)
    drafter.bind(target.model.embed_tokens, target.lm_head)
    fuse_projections(drafter)
    return drafter.eval()


def build_mtp(target: TargetModel, mix: str = "Q4_K_M") -> MTPHead:
    """The target's own MTP layer (one decoder layer of the target's kind, fc 2H -> H, three norms) in `mix`,
    bound to `target` (its embedding, head and RoPE)."""
    from dflash_chat.engine.checkpoint import materialise

    p = target.model.norm.weight
    with torch.device("meta"):
        head = MTPHead(target.cfg)
    materialise(head, SyntheticWeights(head, mix, 1, p.device, seed=2), p.device, p.dtype, "synthetic MTP layer")
    fuse_projections(head)
    head.bind(target)
    return head.eval()


def build_vision(name: str, target: TargetModel, target_layers: int | None = None) -> VisionTower:
    """The target's vision tower (cut as `vision_config` cuts it) with random weights in the target's compute dtype,
    as a loaded tower holds them (an mmproj's F16, BF16 or Q8_0 tensors are decoded as they load)."""
    from dflash_chat.engine.checkpoint import materialise

    p = target.model.norm.weight
    cfg = vision_config(name, target_layers)
    with torch.device("meta"):
        tower = VisionTower(cfg)
    weights = SyntheticWeights(tower, "bf16", cfg.depth, p.device, seed=3)
    materialise(tower, weights, p.device, p.dtype, "synthetic vision tower")
    return tower.eval()


def bytes_per_token(model: nn.Module) -> int:
    """Weight bytes one token's forward reads: every weight once, but one row of an embedding table and
    only the routed experts a token picks (top-k of E)."""
    from dflash_chat.engine.quantized import QuantEmbedding, QuantExperts

    top_k = getattr(getattr(model, "cfg", None), "num_experts_per_tok", 0) or 1
    total = 0
    for module in model.modules():
        size = sum(
            t.numel() * t.element_size() for t in (*module.parameters(recurse=False), *module.buffers(recurse=False))
        )
        if isinstance(module, (nn.Embedding, QuantEmbedding)):
            size //= module.num_embeddings
        elif isinstance(module, QuantExperts):
            size = size * top_k // module.num_experts
        elif isinstance(module, Experts):
            size = size * top_k // module.gate_up_proj.shape[0]
        elif isinstance(module, CandidateSelector):  # codebook rows of the K candidates and the predecessor
            size = size * (module.top_k + 1) // module.predecessor_codebook.shape[0]
        total += size
    return total
