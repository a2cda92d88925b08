"""Read HF safetensors checkpoints (one file, or shards with model.safetensors.index.json).

Tensors load lazily, one at a time (safetensors memory-maps the file). With
`quantize="Q8_0"` or `"Q4_K"` every weight matrix is quantized as it is read
(on `device`, so a GPU does the work), which lets a BF16 drafter run at the
chosen quant without ever holding the whole float model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.ggml.formats import get_format
from dflash_chat.engine.weights.gguf import LazyTensors
from dflash_chat.engine.weights.quant_tensor import QuantTensor

INDEX = "model.safetensors.index.json"
QUANTIZE_ON_LOAD = ("Q8_0", "Q4_K", "Q6_K")
_FALLBACK = {"Q4_K": "Q8_0", "Q6_K": "Q8_0"}


@dataclass
class SafetensorsModel:
    path: Path
    tensors: LazyTensors
    hf_config: dict | None = None
    files: list[Path] = field(default_factory=list)

    @property
    def file_size(self) -> int:
        return sum(f.stat().st_size for f in self.files)


def _shards(path: Path) -> dict[str, Path]:
    """tensor name -> file that holds it."""
    if path.is_file():
        files = [path]
    elif (path / INDEX).is_file():
        try:
            weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise ModelFormatError(f"{path / INDEX}: not a valid safetensors index ({exc}).") from None
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise ModelFormatError(
                f"{path}: weights incomplete, {', '.join(missing)} missing (named in {INDEX}). "
                "Download the model again."
            )
        return {name: path / f for name, f in weight_map.items()}
    else:
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise ModelFormatError(
            f"{path}: no .safetensors weight files found. Point at a model folder or a .safetensors file."
        )
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for f in files:
        try:
            with safe_open(f, "pt") as sf:
                out.update((name, f) for name in sf.keys())
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for corrupt headers
            raise _unreadable(f, exc) from None
    return out


def _unreadable(file: Path, exc: Exception) -> ModelFormatError:
    return ModelFormatError(
        f"{file}: not a readable safetensors file, corrupt or truncated ({exc}). Download it again."
    )


def quant_format_for(name: str, shape: tuple[int, ...], want: str) -> str | None:
    """Format a tensor gets when quantizing on load: matrices only, with a Q8_0 fallback for odd rows."""
    if len(shape) != 2 or "norm" in name or "codebook" in name:  # codebooks are gathered by row
        return None
    while shape[-1] % get_format(want).block_size:
        fallback = _FALLBACK.get(want)
        if fallback is None or shape[-1] % get_format(fallback).block_size:
            return None
        want = fallback
    return want


def read_safetensors(
    path: str | Path, *, quantize: str | None = None, device: torch.device | str | None = None
) -> SafetensorsModel:
    path = Path(path)
    if quantize is not None and quantize.upper() not in QUANTIZE_ON_LOAD:
        raise ModelFormatError(f"cannot quantize on load to {quantize!r}; choose one of {', '.join(QUANTIZE_ON_LOAD)}.")
    where = _shards(path)
    from safetensors import safe_open

    def loader(name: str, file: Path) -> Callable[[], torch.Tensor | QuantTensor]:
        def load():
            try:
                with safe_open(file, "pt", device="cpu") as sf:
                    t = sf.get_tensor(name)
            except Exception as exc:  # noqa: BLE001 - as above, for a tensor's bytes
                raise _unreadable(file, exc) from None
            if device is not None:
                t = t.to(device)
            fmt = quant_format_for(name, tuple(t.shape), quantize.upper()) if quantize else None
            return QuantTensor.from_float(t, fmt) if fmt else t

        return load

    config_dir = path if path.is_dir() else path.parent
    config = None
    if (config_dir / "config.json").is_file():
        try:
            config = json.loads((config_dir / "config.json").read_text())
        except ValueError as exc:
            raise ModelFormatError(f"{config_dir / 'config.json'}: invalid JSON ({exc}).") from None
    return SafetensorsModel(
        path=path,
        tensors=LazyTensors({n: loader(n, f) for n, f in where.items()}),
        hf_config=config,
        files=sorted(set(where.values())),
    )
