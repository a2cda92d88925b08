"""Images as the vision tower takes them: RGB, resized to whole merge blocks within a pixel budget, normalised, cut
into patch rows; what transformers' Qwen2VLImageProcessor (Pillow backend, the one Qwen3.5's processor uses) makes
of them, written from its facts (docs/ARCHITECTURE.md, Facts: The vision tower).

Decoding a file and refusing bad ones is the caller's; this module takes Pillow images.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dflash_chat.engine.errors import ModelFormatError

Grid = tuple[int, int, int]  # an image's (t, h, w) in patches, as transformers' image_grid_thw
MAX_ASPECT = 200  # the reference refuses images longer than this many times their width (or the other way)


@dataclass(frozen=True)
class ImageConfig:
    """The preprocessing a checkpoint declares (`preprocessor_config.json`); Qwen3.5's values by default."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 65536  # 256 x 256
    max_pixels: int = 16777216  # 4096 x 4096
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this many pixels (patch x merge)."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, d: dict) -> ImageConfig:
        """From a `preprocessor_config.json` dict: `size` {shortest_edge, longest_edge} are the pixel budget's
        bounds, as transformers reads them (or the older `min_pixels` / `max_pixels`)."""
        size = d.get("size") or {}
        defaults = cls()
        return cls(
            patch_size=int(d.get("patch_size", defaults.patch_size)),
            merge_size=int(d.get("merge_size", defaults.merge_size)),
            temporal_patch_size=int(d.get("temporal_patch_size", defaults.temporal_patch_size)),
            min_pixels=int(size.get("shortest_edge", d.get("min_pixels", defaults.min_pixels))),
            max_pixels=int(size.get("longest_edge", d.get("max_pixels", defaults.max_pixels))),
            image_mean=tuple(float(v) for v in d.get("image_mean", defaults.image_mean)),
            image_std=tuple(float(v) for v in d.get("image_std", defaults.image_std)),
        )

    @classmethod
    def from_folder(cls, folder: Path) -> ImageConfig | None:
        """A folder's `preprocessor_config.json`, or None when it has none."""
        path = Path(folder) / "preprocessor_config.json"
        if not path.is_file():
            return None
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError, AttributeError) as exc:
            raise ModelFormatError(
                f"{path} is not a valid preprocessor config ({exc}): re-download the model"
            ) from None


def smart_resize(height: int, width: int, cfg: ImageConfig) -> tuple[int, int]:
    """The reference's target size: each side rounded to a multiple of `factor`, then scaled down (floor) into
    max_pixels or up (ceil) to min_pixels, the aspect ratio kept as nearly as whole blocks allow."""
    factor = cfg.factor
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"an image {width} x {height} is more than {MAX_ASPECT} times as long as it is wide")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > cfg.max_pixels:
        beta = math.sqrt(height * width / cfg.max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def to_rgb(image):
    """RGB, transparency laid over white (the reference's convert_to_rgb)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def image_array(image, cfg: ImageConfig) -> np.ndarray:
    """[3, H, W] float32, resized (bicubic, on the 8-bit image) and normalised as the reference does."""
    from PIL import Image

    rgb = to_rgb(image)
    h, w = smart_resize(rgb.height, rgb.width, cfg)
    resized = np.asarray(rgb.resize((w, h), resample=Image.Resampling.BICUBIC))
    scaled = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array(cfg.image_mean, dtype=np.float32)
    std = np.array(cfg.image_std, dtype=np.float32)
    return np.ascontiguousarray(((scaled - mean) / std).transpose(2, 0, 1))


def patches(array: np.ndarray, cfg: ImageConfig) -> tuple[np.ndarray, Grid]:
    """[3, H, W] -> patch rows [h * w, C * T * P * P] in merge-block order, and the grid (1, h, w). A still image
    fills both temporal frames of a patch with itself."""
    c, height, width = array.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = height // p, width // p
    blocks = array.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
    return frames.reshape(gh * gw, c * t * p * p), (1, gh, gw)


def preprocess(images: Sequence, cfg: ImageConfig) -> tuple[torch.Tensor, list[Grid]]:
    """(pixels [rows, C * T * P * P] float32, one grid per image) for the vision tower, the images in order."""
    rows, grids = [], []
    for image in images:
        r, grid = patches(image_array(image, cfg), cfg)
        rows.append(r)
        grids.append(grid)
    return torch.from_numpy(np.concatenate(rows)), grids
