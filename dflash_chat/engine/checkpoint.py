"""Checkpoints into our modules: HF folders (config.json + safetensors, single or sharded) and
mappings of HF name -> tensor from any reader (GGUF, safetensors with quantize-on-load).

Names follow the HF checkpoints; the multimodal Qwen3.5/3.6 prefix `model.language_model.` is
accepted (text weights only), vision weights are ignored, the MTP layer's are read apart (`mtp=True`), and
per-expert MoE tensors (`mlp.experts.E.gate_proj.weight`...) are stacked into the fused [E, 2I, H] /
[E, H, I] layout.

`materialise` fills a model built on the meta device one module at a time: a Linear, Embedding or
routed-experts module whose weights arrive packed (QuantTensor) is swapped for its Quant* twin, so a
quantized checkpoint is never expanded; every other parameter is allocated on the device in the
model dtype and copied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.models.layers import Experts
from dflash_chat.engine.placement import Placement
from dflash_chat.engine.quantized import QuantEmbedding, QuantExperts, QuantLinear
from dflash_chat.engine.weights.gguf import LazyTensors
from dflash_chat.engine.weights.quant_tensor import QuantTensor

IGNORED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.", "model.vision_tower.")


def read_config(directory: Path, what: str) -> dict:
    path = Path(directory) / "config.json"
    if not Path(directory).is_dir():
        raise ModelFormatError(f"{what} folder {directory} does not exist")
    if not path.is_file():
        raise ModelFormatError(f"{what} folder {directory} has no config.json: point to a Hugging Face model folder")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFormatError(f"{path} is not valid JSON ({exc}): re-download the model") from exc


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def check_layers(what: str, layers: int, names) -> None:
    """The config's layer count against the layers the weights hold (before a module is built from it)."""
    found = {int(m.group(1)) for name in names if (m := _LAYER.search(name))}
    if found == set(range(layers)):
        return
    held = f"{len(found)} (layers {min(found)}-{max(found)})" if found else "none"
    raise ModelFormatError(
        f"{what} config says {layers} layers, its weights hold {held}: the config and weights do "
        "not belong together; download the model again"
    )


_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def normalise_target_names(tensors: Mapping[str, torch.Tensor], mtp: bool = False) -> LazyTensors:
    """HF checkpoint names -> ours, still lazy: each tensor (or stack of per-expert tensors) is read when asked for.
    `mtp`: the MTP layer's tensors instead, as `mtp.*` (some exports nest them as `model.mtp.*`)."""
    loaders: dict[str, Callable[[], Any]] = {}
    experts: dict[str, dict[str, dict[int, str]]] = {}
    for name in tensors:
        ours = name
        if ours.startswith("model.language_model."):
            ours = "model." + ours[len("model.language_model.") :]
        if ours.startswith("model.mtp."):
            ours = ours.removeprefix("model.")
        if ours.startswith("mtp.") != mtp or (not mtp and ours.startswith(IGNORED_PREFIXES)):
            continue
        m = _EXPERT.match(ours)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = name
            continue
        loaders[ours] = partial(tensors.__getitem__, name)
    for prefix, parts in experts.items():
        n = len(parts.get("gate_proj", {}))

        def gate_up(parts=parts, n=n):
            return torch.stack(
                [torch.cat((tensors[parts["gate_proj"][e]], tensors[parts["up_proj"][e]])) for e in range(n)]
            )

        def down(parts=parts, n=n):
            return torch.stack([tensors[parts["down_proj"][e]] for e in range(n)])

        loaders[f"{prefix}.gate_up_proj"] = gate_up
        loaders[f"{prefix}.down_proj"] = down
    return LazyTensors(loaders)


# --- meta-device models filled from a tensor mapping -------------------------------------------

Matrix = torch.Tensor | QuantTensor
Weight = Matrix | tuple[Matrix, Matrix]  # a pair: routed gate and up experts kept apart (two formats)


def _shape(t: Weight) -> tuple[int, ...]:
    if isinstance(t, tuple):  # routed gate and up experts kept apart: [E, I, H] twice
        gate, up = t
        return (gate.shape[0], gate.shape[1] + up.shape[1], *gate.shape[2:])
    return tuple(t.shape)


def _is_packed(t: Weight) -> bool:
    return isinstance(t, QuantTensor) or (isinstance(t, tuple) and any(isinstance(p, QuantTensor) for p in t))


def _owned(t: Weight, placement: Placement) -> Weight:
    """`t` on the placement's device in memory of its own (never a view of the read-only memory-mapped file)."""
    if isinstance(t, tuple):
        gate, up = t
        return _owned_matrix(gate, placement), _owned_matrix(up, placement)
    return _owned_matrix(t, placement)


def _owned_matrix(t: Weight, placement: Placement) -> Matrix:
    if isinstance(t, tuple):
        raise ModelFormatError(f"a pair of tensors {_shape(t)} where one matrix belongs: the file is damaged")
    if isinstance(t, QuantTensor):
        index = None if t.input_index is None else t.input_index.to(placement.device)
        return QuantTensor(placement.place(t.data), t.fmt, t.shape, index)
    return placement.place(t)


def _nbytes(t: Weight) -> int:
    if isinstance(t, tuple):
        return sum(_nbytes(p) for p in t)
    return t.nbytes if isinstance(t, QuantTensor) else t.numel() * t.element_size()


def _as_float(t: Weight) -> torch.Tensor:
    if isinstance(t, tuple):
        return torch.cat([_as_float(p) for p in t], dim=1)
    return t.dequantize() if isinstance(t, QuantTensor) else t


def _quant_twin(module: nn.Module, weights: dict[str, Weight], placement: Placement, dtype) -> nn.Module | None:
    """The Quant* module holding `weights` packed; None for other modules or plain float weights."""
    if not any(_is_packed(t) for t in weights.values()):
        return None
    if isinstance(module, nn.Linear):
        return QuantLinear(_owned_matrix(weights["weight"], placement))
    if isinstance(module, nn.Embedding):
        return QuantEmbedding(_owned_matrix(weights["weight"], placement), dtype=dtype)
    if isinstance(module, Experts):
        # a pair may hold a float half beside a packed one, which QuantExperts takes (as_quant); its annotation
        # says packed halves only
        gate_up = _owned(weights["gate_up_proj"], placement)
        return QuantExperts(gate_up, _owned_matrix(weights["down_proj"], placement))  # type: ignore[arg-type]
    return None


def _fill(param: nn.Parameter, t: Weight, placement: Placement, dtype) -> nn.Parameter:
    t = _as_float(_owned(t, placement))  # a packed tensor where no quantized module exists (tiny vectors): decode it
    if param.dim() == 3 and t.dim() == 2:  # conv1d weight stored [C, K]
        t = t.unsqueeze(1)
    if t.dtype == dtype and tuple(t.shape) == tuple(param.shape):
        return nn.Parameter(t)
    out = torch.empty(param.shape, device=placement.device, dtype=dtype)
    with torch.no_grad():
        out.copy_(t)
    return nn.Parameter(out)


def materialise(
    model: nn.Module,
    tensors: Mapping[str, Weight],
    device,
    dtype,
    what: str,
    skip: tuple[str, ...] = (),
    placement: Placement | None = None,
) -> None:
    """Load `tensors` into a meta-device `model`, one module at a time; names in `skip` stay on meta.

    `placement` moves the tensors to the device and counts their bytes (a progress display's); by
    default a plain one for `device`."""
    placement = placement or Placement(device)
    wanted = [n for n, _ in model.named_parameters() if n not in skip]
    missing = [n for n in wanted if n not in tensors]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelFormatError(f"{what} weights are missing {shown}: the files do not match the model's config")
    for name, module in list(model.named_modules()):
        prefix = f"{name}." if name else ""
        own = [(p, prefix + p) for p, _ in module.named_parameters(recurse=False) if prefix + p not in skip]
        if not own:
            continue
        weights = {p: tensors[full] for p, full in own}
        for p, full in own:
            want = tuple(getattr(module, p).shape)
            got = _shape(weights[p])
            if got != want and not (full.endswith("conv1d.weight") and got == (want[0], want[2])):
                raise ModelFormatError(
                    f"{what} tensor {full} has shape {got}, the model's config implies {want}: "
                    "the weights and config do not belong together"
                )
        twin = _quant_twin(module, weights, placement, dtype)
        if twin is not None:
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, twin)
        else:
            for p, _ in own:
                setattr(module, p, _fill(getattr(module, p), weights[p], placement, dtype))
        placement.count(sum(_nbytes(t) for t in weights.values()))
