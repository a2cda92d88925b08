"""Read llama.cpp GGUF files into HF names, HF-shaped configs and packed tensors.

`read_gguf(path)` opens the file memory-mapped (gguf_file.read_header) and returns a
`GGUFModel`: the architecture, an HF config.json-shaped dict, and a lazy mapping
HF name -> tensor in which quantized weights stay packed (`QuantTensor`) and
every converter transform is undone on access, one tensor at a time, so a 20 GB
file is never expanded. Row reorders of packed tensors move whole rows of blocks;
the one column reorder (ssm_out's input columns) is kept as an input gather on the
QuantTensor (exact, no requantization, no extra bytes).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.ggml.formats import BY_GGML_TYPE, FORMATS
from dflash_chat.engine.limits import LIMITS
from dflash_chat.engine.weights import names
from dflash_chat.engine.weights.gguf_file import Header, Skipped, read_header
from dflash_chat.engine.weights.quant_tensor import QuantTensor

T = TypeVar("T")

_MODEL_TYPE = {"qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text", "qwen3": "qwen3"}
_HF_ARCH = {"qwen35": "Qwen3_5ForCausalLM", "qwen35moe": "Qwen3_5MoeForCausalLM", "qwen3": "Qwen3ForCausalLM"}


class LazyTensors(Mapping):
    """HF name -> tensor, each built from the memory-mapped file when first asked for (not cached)."""

    def __init__(self, loaders: dict[str, Callable[[], Any]]):
        self._loaders = loaders

    def __getitem__(self, name: str):
        return self._loaders[name]()

    def __contains__(self, name: object) -> bool:  # Mapping's default would load the tensor
        return name in self._loaders

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)


@dataclass
class GGUFModel:
    path: Path
    arch: str
    hf_config: dict
    tensors: LazyTensors
    chat_template: str | None = None
    ignored: list[str] = field(default_factory=list)  # GGUF tensors not loaded (MTP stand-ins, unknown)
    header: Header | None = None


# --- opening and validating -------------------------------------------------------


def _fields(header: Header) -> dict[str, Any]:
    """Metadata as Python values, less the tokenizer's arrays (~250k entries: only the tokenizer needs them)."""
    return {
        k: v
        for k, v in header.fields.items()
        if not (k.startswith("tokenizer.ggml.") and isinstance(v, (list, Skipped)))
    }


def check_types(path: Path, header: Header) -> None:
    for t in header.tensors:
        if int(t.tensor_type) not in BY_GGML_TYPE:
            known = ", ".join(FORMATS)
            raise ModelFormatError(
                f"{path}: tensor {t.name} is {t.tensor_type.name}, which dflash-chat cannot run "
                f"(supported: {known}). Pick a Q8_0, Q6_K, Q5_K_M or Q4_K_M file."
            )


# --- raw tensors ---------------------------------------------------------------------


def raw_tensor(t) -> torch.Tensor | QuantTensor:
    """A tensor record as a torch tensor sharing the file's memory (float) or a packed QuantTensor."""
    fmt = BY_GGML_TYPE[int(t.tensor_type)]
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    shape = (1,) * (names.gguf_rank(t.name) - len(shape)) + shape  # leading 1s a ggml writer dropped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the memmap is read-only; we never write to it
        data = torch.from_numpy(np.asarray(t.data))
    if fmt.quantized:
        return QuantTensor(data.reshape(*shape[:-1], -1), fmt, shape)
    if data.dtype == torch.uint8:  # BF16 comes back as bytes
        data = data.reshape(-1).view(fmt.plain_dtype)
    return data.reshape(shape)


_HEAD_ORDER = (names.QKV_V, names.V_ROWS, names.V_HEADS, names.OUT_COLS)


def _undo(t: torch.Tensor | QuantTensor, transform: str | None, dims) -> torch.Tensor | QuantTensor:
    if transform is None:
        return t
    if transform in _HEAD_ORDER and dims is not None and not dims.reordered:
        return t  # as many K as V heads: the converter regrouped nothing
    if isinstance(t, QuantTensor):
        if transform in (names.QKV_V, names.V_ROWS, names.V_HEADS) and len(t.shape) == 2 and dims is not None:
            return t.permute_rows(names.invert(dims.row_perm(transform, t.shape[0])))
        if transform == names.OUT_COLS and dims is not None:
            return QuantTensor(t.data, t.fmt, t.shape, dims.row_perm(names.OUT_COLS, t.shape[1]))
        t = t.dequantize()  # tiny tensors (norms, conv, A) are F32 in real files; be safe anyway
    if transform in (names.NORM, names.A_LOG):
        t = t.float()  # undo in float32 (these tensors are F32 in llama.cpp files anyway)
    return names.from_gguf(t, transform, dims)


def _concat_rows(gate, up):
    if isinstance(gate, QuantTensor) and isinstance(up, QuantTensor):
        if gate.fmt != up.fmt:
            return (gate, up)  # QuantExperts takes the pair as is
        data = torch.cat([gate.data, up.data], dim=1)
        return QuantTensor(data, gate.fmt, (gate.shape[0], gate.shape[1] + up.shape[1], gate.shape[2]))
    if isinstance(gate, QuantTensor) or isinstance(up, QuantTensor):
        return (gate, up)
    return torch.cat([gate, up], dim=1)


# --- configs -----------------------------------------------------------------------------


def _get(kv: dict, arch: str, key: str, default=None):
    value = kv.get(f"{arch}.{key}", default)
    if isinstance(value, float):  # stored as float32: give back the short decimal it came from (1e-06)
        value = float(str(np.float32(value)))
    return value


def _rope_params(kv: dict, arch: str, head_dim: int) -> dict:
    theta = float(_get(kv, arch, "rope.freq_base", 10000.0))
    rope = {"rope_type": "default", "rope_theta": theta}
    dim = _get(kv, arch, "rope.dimension_count")
    if dim:
        rope["partial_rotary_factor"] = int(dim) / head_dim
    sections = _get(kv, arch, "rope.dimension_sections")
    if sections:
        rope["mrope_section"] = [int(s) for s in sections if int(s)]
        rope["mrope_interleaved"] = True
    return rope


def _bounded_blocks(blocks: int, arch: str) -> int:
    """A block count a real model can have (checked before anything loops over it or is built from it)."""
    if not 1 <= blocks <= LIMITS["num_hidden_layers"]:
        raise ModelFormatError(
            f"GGUF {arch}.block_count is {blocks}, expected 1 to {LIMITS['num_hidden_layers']}: "
            "the file is damaged or not a supported model"
        )
    return blocks


def _layer_count(kv: dict, arch: str) -> int:
    blocks = _bounded_blocks(int(_get(kv, arch, "block_count", 0)), arch)
    return blocks - int(_get(kv, arch, "nextn_predict_layers", 0) or 0)


def _transformer_fields(kv: dict, arch: str, layers: int) -> dict:
    """The config fields targets and drafters share: widths, heads, norm eps, context, RoPE theta."""
    hidden = int(_get(kv, arch, "embedding_length"))
    heads = int(_get(kv, arch, "attention.head_count"))
    head_dim = int(_get(kv, arch, "attention.key_length", hidden // heads))
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(_get(kv, arch, "attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(_get(kv, arch, "attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(_get(kv, arch, "context_length", 32768)),
        "rope_theta": _rope_params(kv, arch, head_dim)["rope_theta"],
    }


def _target_config(kv: dict, arch: str, tensor_names: set[str], vocab: int) -> dict:
    layers = _layer_count(kv, arch)
    cfg = {
        "architectures": [_HF_ARCH[arch]],
        "model_type": _MODEL_TYPE[arch],
        "vocab_size": vocab,
        **_transformer_fields(kv, arch, layers),
        "intermediate_size": int(_get(kv, arch, "feed_forward_length", 0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    rope = cfg["rope_parameters"] = _rope_params(kv, arch, cfg["head_dim"])
    if arch == "qwen3":
        return cfg
    cfg["partial_rotary_factor"] = rope.setdefault("partial_rotary_factor", 0.25)
    v_heads = int(_get(kv, arch, "ssm.time_step_rank"))
    cfg.update(
        {
            "linear_conv_kernel_dim": int(_get(kv, arch, "ssm.conv_kernel", 4)),
            "linear_key_head_dim": int(_get(kv, arch, "ssm.state_size")),
            "linear_num_key_heads": int(_get(kv, arch, "ssm.group_count")),
            "linear_num_value_heads": v_heads,
            "linear_value_head_dim": int(_get(kv, arch, "ssm.inner_size")) // v_heads,
            "full_attention_interval": int(_get(kv, arch, "full_attention_interval", 4)),
            "layer_types": [
                "linear_attention" if f"blk.{i}.attn_qkv.weight" in tensor_names else "full_attention"
                for i in range(layers)
            ],
        }
    )
    if f"blk.{layers}.nextn.eh_proj.weight" in tensor_names:  # the converter kept the MTP layer (not --no-mtp)
        cfg["mtp_num_hidden_layers"] = int(_get(kv, arch, "nextn_predict_layers", 0) or 0)
    if arch == "qwen35moe":
        cfg.update(
            {
                "num_experts": int(_get(kv, arch, "expert_count")),
                "num_experts_per_tok": int(_get(kv, arch, "expert_used_count")),
                "moe_intermediate_size": int(_get(kv, arch, "expert_feed_forward_length")),
                "shared_expert_intermediate_size": int(_get(kv, arch, "expert_shared_feed_forward_length", 0)),
            }
        )
    return cfg


def _present(value: T | None, key: str, path: Path, where: str) -> T:
    if value is None:
        raise ModelFormatError(f"{path}: DFlash drafter GGUF has no {key} ({where}); the file is incomplete.")
    return value


def _drafter_config(kv: dict, arch: str, path: Path) -> dict:
    """The z-lab config.json a drafter GGUF came from, in either schema (docs/ARCHITECTURE.md, GGUF layouts).

    The fork (`dflash-draft`) keeps its DFlash keys under `dflash-draft.dflash.*` with HF's tap ids.
    Mainline (`dflash`) writes `dflash.block_size`, the mask token as `tokenizer.ggml.mask_token_id` and
    `dflash.target_layers` as HF's ids + 1 (llama.cpp taps the input of the next layer).
    `<arch>.attention.causal`, when present, is the checkpoint's `is_causal` (every layer); when absent each
    layer takes its default (`DrafterConfig.layer_causal`). The fork's converter always writes false, so its
    files run every layer bidirectional; mainline's writes false only for a config saying `is_causal: false`.
    """
    if arch == "dflash-draft":
        ns = "dflash-draft.dflash"
        taps, mask, block = kv.get(f"{ns}.target_layer_ids"), kv.get(f"{ns}.mask_token_id"), kv.get(f"{ns}.block_size")
        where = f"{ns}.target_layer_ids / mask_token_id / block_size"
    else:
        taps = kv.get("dflash.target_layers")
        taps = None if taps is None else [int(i) - 1 for i in taps]
        mask = kv.get("tokenizer.ggml.mask_token_id", kv.get("dflash.mask_token_id"))
        block = kv.get("dflash.block_size")
        where = "dflash.target_layers, tokenizer.ggml.mask_token_id, dflash.block_size"
    taps = _present(taps, "target layers", path, where)
    mask = _present(mask, "mask token id", path, where)
    block = _present(block, "block size", path, where)
    layers = _bounded_blocks(int(_get(kv, arch, "block_count")), arch)
    pattern = _get(kv, arch, "attention.sliding_window_pattern")
    window = _get(kv, arch, "attention.sliding_window")
    types = [
        "sliding_attention" if (pattern is not None and bool(pattern[i]) and window) else "full_attention"
        for i in range(layers)
    ]
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        **_transformer_fields(kv, arch, layers),
        "intermediate_size": int(_get(kv, arch, "feed_forward_length")),
        "block_size": int(block),
        # llama.cpp hands a tap of the target's last layer over before the final norm
        "dflash_config": {
            "mask_token_id": int(mask),
            "target_layer_ids": [int(i) for i in taps],
            "last_layer_tap": "raw",
        },
        "layer_types": types,
        "use_sliding_window": "sliding_attention" in types,
        "sliding_window": int(window) if window else None,
    }
    causal = _get(kv, arch, "attention.causal")
    if causal is not None:
        cfg["is_causal"] = bool(causal)
    if arch == "dflash" and int(kv.get("dflash.selector_top_k") or 0) > 0:  # llama.cpp's test for DFlash2
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg["dflash_config"].update({key: kv.get(f"dflash.{key}") for key in names.DFLASH2_KEYS})
    scaling = _rope_scaling(kv, arch)
    if scaling:
        cfg["rope_scaling"] = scaling
    if _get(kv, arch, "vocab_size"):
        cfg["vocab_size"] = int(_get(kv, arch, "vocab_size"))
    return cfg


def _rope_scaling(kv: dict, arch: str) -> dict | None:
    """`rope.scaling.*` keys (the converters write them from the config's rope_scaling) as HF's dict."""
    kind = _get(kv, arch, "rope.scaling.type")
    if kind in (None, "none"):
        return None
    out = {"rope_type": kind, "factor": _get(kv, arch, "rope.scaling.factor")}
    extra = {
        "original_max_position_embeddings": "rope.scaling.original_context_length",
        "beta_fast": "rope.scaling.yarn_beta_fast",
        "beta_slow": "rope.scaling.yarn_beta_slow",
    }
    out.update({hf: _get(kv, arch, key) for hf, key in extra.items() if _get(kv, arch, key) is not None})
    return out


# --- tensor plans ------------------------------------------------------------------------


def _target_loaders(arch: str, cfg: dict, by_name: dict) -> tuple[dict, set[str]]:
    dims = None
    if arch in names.ZERO_CENTRED_ARCHS:
        dims = names.LinearAttnDims(
            cfg["linear_num_key_heads"],
            cfg["linear_num_value_heads"],
            cfg["linear_key_head_dim"],
            cfg["linear_value_head_dim"],
        )
    loaders: dict[str, Callable] = {}
    used: set[str] = set()

    def plan(hf: str, gname: str, transform: str | None) -> None:
        if gname in by_name:
            t = by_name[gname]
            loaders[hf] = lambda: _undo(raw_tensor(t), transform, dims)
            used.add(gname)

    def plan_experts(hf: str, bid: int) -> None:
        fused = names.GGUF_GATE_UP_EXPS.format(bid=bid)
        gate, up = names.GGUF_GATE_EXPS.format(bid=bid), names.GGUF_UP_EXPS.format(bid=bid)
        if fused in by_name:
            plan(hf, fused, None)
        elif gate in by_name and up in by_name:
            g, u = by_name[gate], by_name[up]
            loaders[hf] = lambda g=g, u=u: _concat_rows(raw_tensor(g), raw_tensor(u))
            used.update((gate, up))

    glob, layer = names.target_rules(arch)
    for rule in glob:
        plan(rule.hf, rule.gguf, rule.transform)
    for bid in range(cfg["num_hidden_layers"]):
        for rule in layer:
            plan(rule.hf_name(bid), rule.gguf_name(bid), rule.transform)
        plan_experts(names.EXPERTS_GATE_UP.format(bid=bid), bid)
    if cfg.get("mtp_num_hidden_layers"):
        bid = cfg["num_hidden_layers"]
        for rule in names.mtp_rules(arch):
            plan(rule.hf_name(bid), rule.gguf_name(bid), rule.transform)
        plan_experts(names.MTP_LAYER + "mlp.experts.gate_up_proj", bid)
    return loaders, used


def _drafter_loaders(arch: str, cfg: dict, by_name: dict) -> tuple[dict, set[str]]:
    """The schema's tensor names first, the other schema's as a fallback (community files mix them)."""
    loaders: dict[str, Callable] = {}
    used: set[str] = set()
    schemas = [names.DRAFTER_NAMES[arch]] + [v for k, v in names.DRAFTER_NAMES.items() if k != arch]
    wanted = {hf: [glob[hf] for glob, _ in schemas] for hf in schemas[0][0]}
    for bid in range(cfg["num_hidden_layers"]):
        for hf in schemas[0][1]:
            wanted[f"layers.{bid}.{hf}"] = [f"blk.{bid}.{layer[hf]}" for _, layer in schemas]
    if "DFlash2DraftModel" in cfg["architectures"]:
        glob, layer = names.DFLASH2_NAMES
        wanted.update({hf: [g] for hf, g in glob.items()})
        wanted.update(
            {
                f"layers.{bid}.{hf}": [f"blk.{bid}.{g}"]
                for bid in range(cfg["num_hidden_layers"])
                for hf, g in layer.items()
            }
        )
    for hf, candidates in wanted.items():
        gname = next((g for g in candidates if g in by_name), None)
        if gname is not None:
            loaders[hf] = lambda t=by_name[gname]: raw_tensor(t)
            used.add(gname)
    return loaders, used


# llama.cpp's gguf-split part names: NAME-0000i-of-0000n.gguf (group 1: the part, group 2: the count)
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})(?=\.gguf$)", re.IGNORECASE)


def _split_parts(path: Path, header: Header, kv: dict) -> list[tuple[Path, Header]]:
    """(path, header) of every part of a split GGUF (llama.cpp's gguf-split: NAME-0000i-of-0000n.gguf).

    The first part holds the metadata and some tensors; the others hold only tensors.
    """
    count = int(kv.get("split.count", 1) or 1)
    if count <= 1:
        return [(path, header)]
    m = SPLIT_PART.search(path.name)
    if m is None:
        raise ModelFormatError(
            f"{path} is one part of a {count}-part split GGUF renamed from NAME-0000i-of-"
            f"{count:05d}.gguf: keep the parts' names as downloaded."
        )
    if int(kv.get("split.no", 0) or 0) != 0:
        first = f"{path.name[: m.start()]}-00001-of-{count:05d}.gguf"
        raise ModelFormatError(f"{path} is part of a {count}-part split GGUF: pass its first part ({first}).")
    parts = [(path, header)]
    for i in range(2, count + 1):
        part = path.with_name(f"{path.name[: m.start()]}-{i:05d}-of-{count:05d}.gguf")
        if not part.is_file():
            raise ModelFormatError(f"{path}: part {part.name} of this split GGUF is missing. Download it again.")
        parts.append((part, read_header(part)))
    return parts


def read_gguf(path: str | Path) -> GGUFModel:
    path = Path(path)
    header = read_header(path)
    kv = _fields(header)
    parts = _split_parts(path, header, kv)
    arch = kv.get("general.architecture")
    supported = names.TARGET_ARCHS + names.DRAFTER_ARCHS
    if arch not in supported:
        raise ModelFormatError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(supported)}).")
    for part_path, part in parts:
        check_types(part_path, part)
    by_name = {t.name: t for _, part in parts for t in part.tensors}
    try:
        if arch in names.TARGET_ARCHS:
            embd = by_name.get("token_embd.weight")
            tokens = header.fields.get("tokenizer.ggml.tokens")
            vocab = int(embd.shape[1]) if embd is not None else tokens.count if tokens is not None else 0
            cfg = _target_config(kv, arch, set(by_name), vocab)
            loaders, used = _target_loaders(arch, cfg, by_name)
        else:
            cfg = _drafter_config(kv, arch, path)
            loaders, used = _drafter_loaders(arch, cfg, by_name)
    except (TypeError, KeyError, ValueError, IndexError) as exc:
        raise ModelFormatError(f"{path}: {arch} GGUF is missing hyperparameters ({exc}).") from None
    eos = kv.get("tokenizer.ggml.eos_token_id")
    if eos is not None:
        cfg["eos_token_id"] = int(eos)
    if kv.get("tokenizer.ggml.bos_token_id") is not None:
        cfg["bos_token_id"] = int(kv["tokenizer.ggml.bos_token_id"])
    return GGUFModel(
        path=path,
        arch=arch,
        hf_config=cfg,
        tensors=LazyTensors(loaders),
        chat_template=kv.get("tokenizer.chat_template"),
        ignored=sorted(set(by_name) - used),
        header=header,
    )
