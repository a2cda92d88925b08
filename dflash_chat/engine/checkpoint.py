"""HF-format checkpoints (config.json + safetensors, single or sharded) into our modules.

Names follow the HF checkpoints; the multimodal Qwen3.5/3.6 prefix `model.language_model.` is
accepted (text weights only), vision and MTP weights are ignored, and per-expert MoE tensors
(`mlp.experts.E.gate_proj.weight`...) are stacked into the fused [E, 2I, H] / [E, H, I] layout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from dflash_chat.engine.errors import ModelFormatError

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


def safetensors_files(directory: Path, what: str) -> list[Path]:
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelFormatError(f"{what} weights incomplete: {', '.join(missing)} missing in {directory}; re-download the model")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{what} folder {directory} has no .safetensors weight files")
    return files


def read_tensors(directory: Path, what: str) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(directory, what):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    tensors[name] = f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise ModelFormatError(f"cannot read {file}: {exc}; the file is corrupt or truncated, re-download it") from exc
    return tensors


_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def normalise_target_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, t in tensors.items():
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model.") :]
        if name.startswith(IGNORED_PREFIXES):
            continue
        m = _EXPERT.match(name)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = t
            continue
        out[name] = t
    for prefix, parts in experts.items():
        n = len(parts.get("gate_proj", {}))
        gate = [parts["gate_proj"][e] for e in range(n)]
        up = [parts["up_proj"][e] for e in range(n)]
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat((g, u)) for g, u in zip(gate, up)])
        out[f"{prefix}.down_proj"] = torch.stack([parts["down_proj"][e] for e in range(n)])
    return out


def load_into(module: nn.Module, tensors: dict[str, torch.Tensor], what: str, optional: tuple[str, ...] = ()) -> None:
    """Copy tensors into the module's parameters, refusing missing tensors and shape mismatches."""
    params = dict(module.named_parameters())
    missing = [n for n in params if n not in tensors and n not in optional]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelFormatError(f"{what} weights are missing {shown}: the files do not match config.json")
    for name, p in params.items():
        if name not in tensors:
            continue
        t = tensors[name]
        if name.endswith("conv1d.weight") and t.dim() == 2:
            t = t.unsqueeze(1)
        if tuple(t.shape) != tuple(p.shape):
            raise ModelFormatError(
                f"{what} tensor {name} has shape {tuple(t.shape)}, config.json implies {tuple(p.shape)}: "
                "the weights and config.json do not belong together"
            )
        with torch.no_grad():
            p.copy_(t.to(p.dtype))
