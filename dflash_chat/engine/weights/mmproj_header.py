"""An mmproj GGUF's header, checked to be a Qwen3.5/3.6 vision tower without reading a tensor (no torch): what
`--mmproj FILE` is checked with before anything loads, and where engine/weights/mmproj.py starts."""

from __future__ import annotations

from pathlib import Path

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.weights.gguf_file import Header, read_header

PROJECTOR = "qwen3vl_merger"


def read_mmproj_header(path: str | Path) -> Header:
    """The header of an mmproj GGUF holding Qwen3.5's tower (llama.cpp's `clip` architecture, projector
    `qwen3vl_merger`, a vision encoder); ModelFormatError (one line, saying what to pass) for any other file."""
    path = Path(path)
    header = read_header(path)
    kv = header.fields
    if kv.get("general.architecture") != "clip":
        raise ModelFormatError(
            f"{path} is not an mmproj file (architecture {kv.get('general.architecture')!r}, not 'clip'): pass the "
            "mmproj-*.gguf that came with the model"
        )
    projector = kv.get("clip.vision.projector_type", kv.get("clip.projector_type"))
    if projector != PROJECTOR:
        raise ModelFormatError(
            f"{path} holds a {projector!r} vision projector; dflash-chat runs Qwen3.5/3.6's ({PROJECTOR!r}): pass "
            "the mmproj file made for this model"
        )
    if not kv.get("clip.has_vision_encoder", True):
        raise ModelFormatError(f"{path} has no vision encoder: pass the mmproj file made for this model")
    return header
