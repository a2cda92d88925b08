"""`bench --synthetic MODEL --image WxH`: the vision tower at the model's real shapes, with random weights, beside
the prefill of the prompt it feeds.

The tower (engine/models/vision.py) is built at its published vision_config (bench/synthetic_models.py VISION: 27
blocks of 1152, patch 16, 2 x 2 merge) in the compute dtype, as a loaded tower holds its weights. An image of each
size given (random pixels: the tower's cost does not depend on what it shows) is prepared as the reference processor
does, within Qwen3.5's pixel budget (engine/models/vision_input.py), and one prompt holds them all, between the two
halves of the bench's text prompt. Measured, on whatever device the bench runs:
- the tower over the prompt's images: its time (the median of repeats, device time on CUDA), its weights, and its
  peak working memory (bench/live_memory.py), beside the memory model's estimate for as many patches
  (engine/memory.py vision_workspace_bytes);
- the engine's prefill of the same prompt, with the images: its time without the tower's (the prefill's own figure,
  stats.prefill_s less stats.vision_s; the median of a quarter as many repeats, at least one: a prefill is many
  steps' work) and its peak working memory, the tower's run included.
With --layers the tower is cut in proportion to the target (at least one block): its time and weights scale with
its depth, its working memory does not (its blocks run one after another).

No torch at import: the flag's parser (`image_size`) is read before anything loads.
"""

from __future__ import annotations

import argparse
import re
import statistics

MAX_SIDE = 8192  # pixels; a larger image is only resized down to the same budget, after being drawn in host memory
MAX_ASPECT = 200  # as engine/models/vision_input.py: the reference refuses longer images


def image_size(text: str) -> tuple[int, int]:
    """An argparse `type` for `--image WxH`: (width, height) in pixels."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"must be WIDTHxHEIGHT in pixels, such as 1024x768, got {text!r}")
    width, height = int(match[1]), int(match[2])
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise argparse.ArgumentTypeError(f"each side must be from 1 to {MAX_SIDE} pixels, got {text!r}")
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise argparse.ArgumentTypeError(
            f"an image more than {MAX_ASPECT} times as long as it is wide is refused by the model, got {text!r}"
        )
    return width, height


def random_image(width: int, height: int, seed: int):
    """A Pillow image of random pixels."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def measure(
    target, model: str, sizes, *, layers, prompt_tokens: int, decode: str, repeats: int, warmups: int = 2
) -> dict:
    """The figures of the module docstring for the images of `sizes` ((width, height) each) in one prompt of
    `prompt_tokens` text tokens, on `target`'s device and dtype."""
    import torch

    from dflash_chat.bench import synthetic_models
    from dflash_chat.bench.live_memory import peak_bytes, peak_method
    from dflash_chat.bench.timing import time_call
    from dflash_chat.engine.images import prepare
    from dflash_chat.engine.memory import VisionShape, vision_weight_bytes, vision_workspace_bytes
    from dflash_chat.engine.spec import Engine

    tower = synthetic_models.build_vision(model, target, layers)
    full = synthetic_models.vision_config(model)
    device, e = tower.pos_embed.weight.device, tower.pos_embed.weight.element_size()
    images = prepare([random_image(w, h, seed) for seed, (w, h) in enumerate(sizes)], tower)
    pixels, grids = torch.cat([image.pixels for image in images]), [image.grid for image in images]
    patch = tower.cfg.patch_size
    out: dict = {
        "images": [
            {"size": [w, h], "resized": [g[2] * patch, g[1] * patch], "grid": list(g), "tokens": image.tokens}
            for (w, h), image, g in zip(sizes, images, grids, strict=True)
        ],
        "image_tokens": sum(image.tokens for image in images),
        "patches": int(pixels.shape[0]),
        "depth": tower.cfg.depth,
        "full_depth": full.depth,
        "weight_bytes": sum(p.numel() * p.element_size() for p in tower.parameters()),
        "full_weight_bytes": vision_weight_bytes(VisionShape.of(full), e),
        "peak_method": peak_method(device),
    }
    out["tower_ms"] = 1e3 * time_call(lambda: tower(pixels, grids), device, repeats, warmups=warmups)
    out["tower_peak_bytes"] = peak_bytes(lambda: tower(pixels, grids), device)
    patches_budget = VisionShape.of(tower.cfg, out["patches"] * patch * patch)
    out["tower_peak_estimate_bytes"] = vision_workspace_bytes(patches_budget, e)

    vocab = target.cfg.vocab_size
    image_token = vocab - 1  # random text ids stay below it
    text = torch.randint(0, vocab - 1, (prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    half = len(text) // 2
    prompt = text[:half] + [image_token] * out["image_tokens"] + text[half:]
    engine = Engine(
        target,
        None,
        max_context=len(prompt) + 8,
        decode=decode,
        speculate="none",
        vision=tower,
        image_token_id=image_token,
    )

    def prefill():
        from dflash_chat.engine.events import Finished
        from dflash_chat.engine.sampling_params import SamplingParams

        engine.reset()
        events = engine.generate(prompt, SamplingParams(max_new_tokens=1), images=images)
        return next(event.stats for event in events if isinstance(event, Finished))

    out["prefill_peak_bytes"] = peak_bytes(prefill, device)  # untimed: this first run pays for first-use work
    runs = [prefill() for _ in range(max(1, repeats // 4))]  # a prefill is many steps' work: fewer repeats
    out["prompt_tokens"] = len(prompt)
    out["prefill_ms"] = 1e3 * statistics.median(s.prefill_s - s.vision_s for s in runs)
    out["tower_in_prefill_ms"] = 1e3 * statistics.median(s.vision_s for s in runs)
    out["tower_share"] = out["tower_ms"] / (out["tower_ms"] + out["prefill_ms"])
    return out


def image_lines(v: dict) -> list[str]:
    """The report's lines for the figures `measure` returns."""
    from dflash_chat.models.sizes import size_text

    shown = ", ".join(
        f"{i['size'][0]}x{i['size'][1]}"
        + (f" (resized to {i['resized'][0]}x{i['resized'][1]})" if i["resized"] != i["size"] else "")
        + f" -> {i['tokens']} tokens"
        for i in v["images"]
    )
    cut = (
        f"{v['depth']} of its {v['full_depth']} blocks, cut with --layers in proportion; all {v['full_depth']}: "
        f"{size_text(v['full_weight_bytes'])} of weights"
        if v["depth"] < v["full_depth"]
        else f"all {v['depth']} blocks"
    )
    return [
        f"  image {shown}; the vision tower at its real shapes, {cut}",
        f"  vision tower             {v['tower_ms']:8.3f} ms   weights {size_text(v['weight_bytes'])}, peak working "
        f"memory {size_text(v['tower_peak_bytes'])} (the memory model: {size_text(v['tower_peak_estimate_bytes'])})",
        f"  prefill, same prompt     {v['prefill_ms']:8.3f} ms   {v['prompt_tokens']} tokens ({v['image_tokens']} "
        f"of them the image's), the tower not counted; peak working memory "
        f"{size_text(v['prefill_peak_bytes'])} with the tower's run; the tower is {v['tower_share']:.0%} of the two",
        f"  (peak working memory: {v['peak_method']})",
    ]
