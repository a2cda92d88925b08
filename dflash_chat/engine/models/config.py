"""Model configurations read from HF config.json dicts (both Qwen3.5/3.6 and Qwen3 schemas).

Only the fields the engine uses are kept. Unknown architectures and missing fields raise
ModelFormatError with a message naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.limits import DEFAULT_LIMIT, LIMITS

TARGET_MODEL_TYPES = {
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3": "qwen3",
}


@dataclass(frozen=True)
class RopeScaling:
    """A checkpoint's RoPE frequency scaling (`rope_parameters` / `rope_scaling`), read as transformers reads it.

    `kind` "default" (plain RoPE), "linear" (positions divided by `factor`) or "yarn" (z-lab's Qwen3.6
    drafters). A yarn config without `factor` means max_position_embeddings / original_max_position_embeddings;
    `attention_factor` None: the one YaRN derives from factor, mscale and mscale_all_dim.
    """

    kind: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


SCALED_ROPE_KINDS = ("linear", "yarn")


def _rope(d: dict, partial_default: float = 1.0) -> tuple[float, float, RopeScaling]:
    """(theta, partial_rotary_factor, scaling) from `rope_theta` and `rope_parameters` or `rope_scaling`."""
    params = d.get("rope_scaling") or d.get("rope_parameters") or {}
    theta = params.get("rope_theta", (d.get("rope_parameters") or {}).get("rope_theta", d.get("rope_theta")))
    if theta is None:
        theta = 10000.0
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor", partial_default))
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind == "default":
        return float(theta), float(partial), RopeScaling()
    if kind not in SCALED_ROPE_KINDS:
        raise ModelFormatError(
            f"rope type {kind!r} is not supported (supported: default, {', '.join(SCALED_ROPE_KINDS)})"
        )
    factor = params.get("factor")
    if factor is None and kind == "linear":
        raise ModelFormatError("linear rope scaling without a 'factor'")
    original = (
        params.get("original_max_position_embeddings")
        or d.get("original_max_position_embeddings")
        or d.get("max_position_embeddings")
        or 0
    )
    if kind == "yarn" and not original:
        raise ModelFormatError("yarn rope scaling without original_max_position_embeddings or max_position_embeddings")
    if factor is None:
        factor = d["max_position_embeddings"] / original
    scaling = RopeScaling(
        kind=kind,
        factor=float(factor),
        original_max_position_embeddings=int(original),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )
    return float(theta), float(partial), scaling


def _need(d: dict, key: str, what: str):
    if key not in d:
        raise ModelFormatError(f"{what} config.json has no {key!r}: the file is incomplete or not a supported model")
    return _count(d, key, what)


def _count(d: dict, key: str, what: str, default: int | None = None, minimum: int = 1) -> int:
    """A size field as a whole number in [minimum, its limit], or a one-line ModelFormatError."""
    value = d.get(key, default)
    limit = LIMITS.get(key, DEFAULT_LIMIT)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= limit:
        raise ModelFormatError(
            f"{what} config.json has {key} = {value!r}, expected a whole number from {minimum} "
            f"to {limit}: the file is damaged or not a supported model"
        )
    return value


@dataclass
class TargetConfig:
    arch: str  # "qwen3_5" | "qwen3_5_moe" | "qwen3"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    layer_types: list[str]
    tie_word_embeddings: bool = False
    # Gated DeltaNet (linear attention) layers
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    eos_token_id: list[int] = field(default_factory=list)
    max_position_embeddings: int = 32768
    # multi-token prediction layers the checkpoint declares (`mtp_num_hidden_layers`; Qwen3.5/3.6 only)
    mtp_layers: int = 0
    # how many rotary frequency pairs read the temporal, height and width positions of a prompt with images
    # (`rope_parameters.mrope_section`, interleaved; transformers' default when absent)
    mrope_section: tuple[int, int, int] = (11, 11, 10)

    @property
    def zero_centred_norm(self) -> bool:
        """Qwen3.5/3.6 RMSNorms compute x * (1 + w); Qwen3's compute x * w."""
        return self.arch != "qwen3"

    @property
    def gated_attention(self) -> bool:
        return self.arch != "qwen3"

    @property
    def is_moe(self) -> bool:
        return self.arch == "qwen3_5_moe"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_dict(cls, raw: dict) -> "TargetConfig":
        model_type = raw.get("model_type")
        d = raw
        if "text_config" in raw and isinstance(raw["text_config"], dict):
            d = dict(raw["text_config"])
            d.setdefault("model_type", model_type + "_text" if model_type else None)
            d.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", False))
            d.setdefault("eos_token_id", raw.get("eos_token_id"))
        model_type = d.get("model_type")
        arch = TARGET_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
        if arch is None:
            known = ", ".join(sorted(set(TARGET_MODEL_TYPES)))
            raise ModelFormatError(f"unknown target architecture {model_type!r}; supported model_type: {known}")
        what = f"target ({model_type})"
        hidden = _need(d, "hidden_size", what)
        heads = _need(d, "num_attention_heads", what)
        layers = _need(d, "num_hidden_layers", what)
        theta, partial, scaling = _rope(
            d, 1.0 if arch == "qwen3" else 0.25
        )  # Qwen3.5/3.6 rotate a quarter of each head
        if scaling.kind != "default":
            raise ModelFormatError(f"{what}: rope type {scaling.kind!r} is not supported for targets (only plain RoPE)")
        layer_types = d.get("layer_types")
        if arch == "qwen3":
            layer_types = ["full_attention"] * layers
        elif layer_types is None:
            interval = _count(d, "full_attention_interval", what, 4)
            layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
        if len(layer_types) < layers:
            raise ModelFormatError(f"{what}: layer_types lists {len(layer_types)} layers, expected {layers}")
        eos = d.get("eos_token_id")
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        cfg = cls(
            arch=arch,
            vocab_size=_need(d, "vocab_size", what),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=_count(d, "num_key_value_heads", what, heads),
            head_dim=_count(d, "head_dim", what, hidden // heads) if d.get("head_dim") else hidden // heads,
            intermediate_size=_count(d, "intermediate_size", what, 0, minimum=0),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            partial_rotary_factor=partial,
            layer_types=list(layer_types[:layers]),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            linear_num_key_heads=_count(d, "linear_num_key_heads", what, 0, minimum=0),
            linear_num_value_heads=_count(d, "linear_num_value_heads", what, 0, minimum=0),
            linear_key_head_dim=_count(d, "linear_key_head_dim", what, 0, minimum=0),
            linear_value_head_dim=_count(d, "linear_value_head_dim", what, 0, minimum=0),
            linear_conv_kernel_dim=_count(d, "linear_conv_kernel_dim", what, 4),
            num_experts=_count(d, "num_experts", what, 0, minimum=0),
            num_experts_per_tok=_count(d, "num_experts_per_tok", what, 0, minimum=0),
            moe_intermediate_size=_count(d, "moe_intermediate_size", what, 0, minimum=0),
            shared_expert_intermediate_size=_count(d, "shared_expert_intermediate_size", what, 0, minimum=0),
            eos_token_id=eos,
            max_position_embeddings=_count(d, "max_position_embeddings", what, 32768),
            mtp_layers=0 if arch == "qwen3" else _count(d, "mtp_num_hidden_layers", what, 0, minimum=0),
            mrope_section=_mrope_section(d, what),
        )
        if arch == "qwen3_5_moe" and not (cfg.num_experts and cfg.num_experts_per_tok and cfg.moe_intermediate_size):
            raise ModelFormatError(f"{what}: num_experts, num_experts_per_tok and moe_intermediate_size are required")
        if "linear_attention" in cfg.layer_types and not (cfg.linear_num_key_heads and cfg.linear_num_value_heads):
            raise ModelFormatError(f"{what}: linear attention layers need linear_num_key_heads/linear_num_value_heads")
        return cfg


def _mrope_section(d: dict, what: str) -> tuple[int, int, int]:
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    section = params.get("mrope_section", [11, 11, 10])
    if isinstance(section, list) and len(section) == 4 and section[3] == 0:  # llama.cpp's four, the last unused
        section = section[:3]
    if not (isinstance(section, list) and len(section) == 3 and all(isinstance(s, int) and s >= 0 for s in section)):
        raise ModelFormatError(f"{what}: rope mrope_section is {section!r}, expected three whole numbers")
    return (section[0], section[1], section[2])


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    layer_types: list[str]
    sliding_window: int | None
    # Attention inside the block, for every layer, when the checkpoint states it (is_causal,
    # dflash_config.causal); None: each layer's own default (`layer_causal`).
    causal: bool | None = None
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    # A tap of the target's last layer reads what HF's hidden_states[-1] holds: the final-normed state
    # (z-lab's reference). "raw": the layer's own output, what our first demo drafter was trained on.
    last_layer_tap: str = "normed"
    # DFlash2 (architectures DFlash2DraftModel): convolutions and the candidate selector; None for DFlash
    dflash2: DFlash2Config | None = None

    @property
    def layer_causal(self) -> list[bool]:
        """Per layer, whether a block query sees only the block positions up to its own. As z-lab trained
        the released drafters: sliding layers causal and full layers bidirectional unless `causal` says."""
        if self.causal is not None:
            return [self.causal] * self.num_layers
        return [t == "sliding_attention" for t in self.layer_types]

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        archs = d.get("architectures") or []
        if archs and not any("DFlash" in a for a in archs):
            raise ModelFormatError(f"not a DFlash drafter: architectures is {archs}")
        dflash2 = DFlash2Config.from_dict(d) if any("DFlash2" in a for a in archs) else None
        what = "drafter"
        dflash = d.get("dflash_config") or {}
        block, mask, taps = (_dflash_field(d, name) for name in ("block_size", "mask_token_id", "target_layer_ids"))
        hidden = _need(d, "hidden_size", what)
        heads = _need(d, "num_attention_heads", what)
        layers = _need(d, "num_hidden_layers", what)
        theta, _, scaling = _rope(d)
        layer_types = list((d.get("layer_types") or ["full_attention"] * layers)[:layers])
        sliding = "sliding_attention" in layer_types
        # without use_sliding_window a sliding layer keeps its type (its causality) but has no window
        window = d.get("sliding_window") if d.get("use_sliding_window", sliding) and sliding else None
        last_tap = dflash.get("last_layer_tap", "normed")
        if last_tap not in ("normed", "raw"):
            raise ModelFormatError(f"drafter dflash_config.last_layer_tap is {last_tap!r}: expected 'normed' or 'raw'")
        return cls(
            hidden_size=hidden,
            intermediate_size=_need(d, "intermediate_size", what),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=_count(d, "num_key_value_heads", what, heads),
            head_dim=_count(d, "head_dim", what, hidden // heads) if d.get("head_dim") else hidden // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            block_size=_count({"block_size": block}, "block_size", what),
            mask_token_id=_count({"mask_token_id": mask}, "mask_token_id", what, minimum=0),
            target_layer_ids=[int(i) for i in taps],
            layer_types=layer_types,
            sliding_window=window,
            causal=_causal(d),
            rope_scaling=scaling,
            last_layer_tap=last_tap,
            dflash2=dflash2,
        )


@dataclass(frozen=True)
class DFlash2Config:
    """What DFlash2 adds to a DFlash drafter (z-lab/dflash 07ebd93 `DFlash2DraftModel`), from `dflash_config`
    (or the top level): a two-sided grouped dynamic convolution of `conv_kernel_size` taps, one kernel per
    `conv_group_size` channels, around each layer's attention and MLP; a candidate selector over the
    `selector_top_k` best draft tokens per position with `selector_rank`-wide codebooks; and scales on the
    block's input embeddings and on the draft logits (then a tanh soft cap), 1 / 1 / none when absent."""

    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "DFlash2Config":
        merged = {**d, **(d.get("dflash_config") or {})}  # dflash_config first, then the top level

        def get(key: str, default=None):
            value = merged.get(key)
            return default if value is None else value

        what = "DFlash2 drafter"
        taps, group, rank, top_k = (
            _count(merged, key, what)
            for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
        )
        hidden = d.get("hidden_size")
        if isinstance(hidden, int) and hidden % group:
            raise ModelFormatError(f"DFlash2 drafter conv_group_size {group} does not divide hidden_size {hidden}")
        input_scale, output_scale = (
            _positive(get(key, 1.0), key) for key in ("input_embedding_scale", "output_multiplier")
        )
        cap = get("final_logit_softcapping")
        return cls(
            conv_kernel_size=taps,
            conv_group_size=group,
            selector_rank=rank,
            selector_top_k=top_k,
            input_embedding_scale=input_scale,
            output_multiplier=output_scale,
            final_logit_softcapping=None if cap is None else _positive(cap, "final_logit_softcapping"),
        )


def _positive(value, key: str) -> float:
    """A finite positive number of a DFlash2 config, or a one-line ModelFormatError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ModelFormatError(f"DFlash2 drafter {key} is {value!r}: expected a positive number")
    return float(value)


def _dflash_field(d: dict, name: str):
    """A DFlash setting from `dflash_config`, else the top level; a one-line ModelFormatError when neither has it."""
    value = (d.get("dflash_config") or {}).get(name, d.get(name))
    if value is None:
        raise ModelFormatError(f"drafter config.json has no {name} (top level or in dflash_config)")
    return value


def _causal(d: dict) -> bool | None:
    """Block attention causality as the checkpoint states it for all layers (is_causal, as z-lab reads it, then
    dflash_config.causal, causal), or None."""
    for value in (d.get("is_causal"), (d.get("dflash_config") or {}).get("causal"), d.get("causal")):
        if value is not None:
            return bool(value)
    return None
