"""engine/memory.py's vision terms against the real tower: its weights are exactly the parameters a loaded tower
holds (from an HF-named state dict and from an mmproj GGUF of each type), and its workspace bounds the tensors the
tower's forward holds live at once, measured op by op, without being more than twice them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash_chat.bench.live_memory import LiveBytes
from dflash_chat.engine.load import load_vision
from dflash_chat.engine.memory import VisionShape, vision_bytes, vision_weight_bytes, vision_workspace_bytes
from dflash_chat.engine.models.vision import VisionConfig, VisionTower
from dflash_chat.engine.models.vision_input import ImageConfig, preprocess
from tests.engine.gguf_write import write_mmproj_gguf
from tests.engine.tiny_vlm import VISION as TINY_VISION

VISION = {**TINY_VISION, "out_hidden_size": 48}  # the tiny tower, merged to another width
BUDGET = ImageConfig(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=256, max_pixels=64 * 64)


def _tower() -> VisionTower:
    torch.manual_seed(0)
    return VisionTower(VisionConfig.from_dict(VISION)).eval()


def _bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def test_the_shape_counts_every_parameter_of_the_tower():
    tower = _tower()
    shape = VisionShape.of(tower.cfg, BUDGET.max_pixels)
    assert shape.params == sum(p.numel() for p in tower.parameters())
    assert vision_weight_bytes(shape, 4) == _bytes(tower)
    assert vision_weight_bytes(shape, 2) == _bytes(tower.to(torch.bfloat16))


def test_qwen35s_tower_is_460_million_parameters():
    shape = VisionShape(depth=27, hidden=1152, intermediate=4304, heads=16, out_hidden=5120)
    with torch.device("meta"):
        tower = VisionTower(VisionConfig(out_hidden_size=5120))
    assert shape.params == sum(p.numel() for p in tower.parameters()) == 460_730_096


@pytest.mark.parametrize("ftype", ["F16", "Q8_0"])
def test_an_mmproj_tower_holds_its_weights_decoded_in_the_compute_dtype(tmp_path, ftype):
    tower = _tower()
    path = write_mmproj_gguf(tmp_path / f"mmproj-{ftype}.gguf", tower.state_dict(), VISION, 48, ftype)
    loaded = load_vision(path, "cpu", torch.float32)
    assert _bytes(loaded) == vision_weight_bytes(VisionShape.of(loaded.cfg), 4)
    assert path.stat().st_size < _bytes(loaded)  # the file's size would undercount it


@pytest.mark.parametrize("size", [(64, 64), (128, 32), (200, 20)])
def test_the_workspace_bounds_what_the_tower_holds_for_the_largest_image(size):
    from PIL import Image

    tower = _tower()
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    pixels, grids = preprocess([image], BUDGET)
    assert grids[0][1] * grids[0][2] * 16 <= BUDGET.max_pixels
    counter = LiveBytes()
    with counter:
        tower(pixels, grids)
    estimate = vision_workspace_bytes(VisionShape.of(tower.cfg, BUDGET.max_pixels), 4)
    assert counter.peak <= estimate
    if grids[0][1] * grids[0][2] * 16 == BUDGET.max_pixels:  # an image at the budget: the estimate is near
        assert estimate <= 2 * counter.peak


def test_the_tower_costs_its_weights_and_what_its_activations_need_beyond_the_engines_workspace():
    shape = VisionShape(depth=27, hidden=1152, intermediate=4304, heads=16, out_hidden=5120)
    weights, work = vision_weight_bytes(shape, 2), vision_workspace_bytes(shape, 2)
    assert vision_bytes(shape, 0, 2) == weights + work
    assert vision_bytes(shape, work + 1, 2) == weights
    assert vision_bytes(shape, work // 2, 2) == weights + work - work // 2
