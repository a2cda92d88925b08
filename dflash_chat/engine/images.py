"""A prompt's images as the engine takes them, and what its prefill reads of them.

The caller renders the chat (one placeholder run per image, each run expanded to its image's token count:
`expand_ids`) and hands `Engine.generate` the images in order, prepared for the pair's vision tower (`prepare`: the
patch rows, the grid, the content hash). The engine holds a prompt's tokens as keys of its identity: an image's
tokens are held as a negative id drawn from its hash (`PromptImage.key`), so prefix reuse, checkpoints and parked
conversations (engine/prefix_cache.py, engine/parked.py) never serve one image's state for another, and
prompt lookup never proposes one. An image's tokens count in the context like any other.

`ImagePrefill` is what a prefill of such a prompt reads: the M-RoPE positions of the whole prompt, and each chunk's
input embeddings with the tower's features spliced in; the tower runs once per prompt, and only on the images the
prefill has to run (a prefix reused from the held tokens needs none).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dflash_chat.engine.models.image_prompt import RopePositions, expand, rope_positions
from dflash_chat.engine.models.vision import VisionTower, merged_tokens
from dflash_chat.engine.models.vision_input import Grid, image_array, patches, to_rgb

KEY_BITS = 62  # an image's key is -1 - (62 bits of its hash): below every token id


@dataclass(frozen=True)
class PromptImage:
    """One image of a prompt, ready for the tower."""

    pixels: torch.Tensor  # [rows, C * T * P * P] its patch rows (vision_input.patches)
    grid: Grid
    tokens: int  # the placeholders (feature rows) it takes in the prompt
    digest: bytes  # sha256 of its RGB pixels and size: the image's identity

    @property
    def key(self) -> int:
        """The id its tokens are held as (negative: no token has one)."""
        return -1 - (int.from_bytes(self.digest[:8], "big") >> (64 - KEY_BITS))


def prepare(images: Sequence, tower: VisionTower) -> list[PromptImage]:
    """Pillow images as `tower` takes them, with their content hashes."""
    out = []
    for image in images:
        rgb = to_rgb(image)
        digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode() + rgb.tobytes()).digest()
        rows, grid = patches(image_array(rgb, tower.images), tower.images)
        out.append(PromptImage(torch.from_numpy(rows), grid, merged_tokens(tower.cfg, grid), digest))
    return out


def expand_ids(ids: Sequence[int], image_token_id: int, images: Sequence[PromptImage]) -> list[int]:
    """`ids` as the chat template wrote them (one placeholder per image) with each image's placeholder repeated to
    its token count."""
    return expand(ids, image_token_id, [image.tokens for image in images])


def held_keys(ids: Sequence[int], image_token_id: int, images: Sequence[PromptImage]) -> list[int]:
    """`ids` (expanded) with each image's tokens replaced by the image's key. A run of placeholders that does not fit
    the images is a ValueError that says so."""
    keys = list(ids)
    at, runs = 0, iter(images)
    while at < len(keys):
        if keys[at] != image_token_id:
            at += 1
            continue
        image = next(runs, None)
        if image is None:
            raise ValueError("the prompt holds more image placeholders than it was given images")
        if keys[at : at + image.tokens] != [image_token_id] * image.tokens:
            raise ValueError(f"an image of {image.tokens} tokens has a shorter run of placeholders in the prompt")
        keys[at : at + image.tokens] = [image.key] * image.tokens
        at += image.tokens
    if next(runs, None) is not None:
        raise ValueError("the prompt was given more images than it holds runs of image placeholders")
    return keys


@dataclass(frozen=True)
class ChunkInput:
    """A prefill chunk's part of a prompt with images."""

    embeds: torch.Tensor  # [T, H] its input embeddings, the images' rows the tower's features
    rope: torch.Tensor  # [3, T] its M-RoPE positions
    pair_rope: torch.Tensor  # [3, T] the positions of the tokens one before each (the MTP layer's rows)


class ImagePrefill:
    """What a prefill of `ids` (expanded) with `images` in order reads: the keys the engine holds, the prompt's
    M-RoPE positions and offset, and each chunk's input (`chunk`)."""

    def __init__(
        self,
        ids: Sequence[int],
        images: Sequence[PromptImage],
        tower: VisionTower,
        embed_tokens: nn.Module,
        image_token_id: int,
    ):
        self.ids, self.images, self.tower = list(ids), list(images), tower
        self.embed_tokens, self.image_token_id = embed_tokens, image_token_id
        self.keys = held_keys(self.ids, image_token_id, self.images)
        grids = [image.grid for image in self.images]
        self.rope: RopePositions = rope_positions(self.ids, image_token_id, grids, tower.cfg.spatial_merge_size)
        self.starts = _run_starts(self.keys, self.images)
        self._features: dict[int, torch.Tensor] = {}
        self.seconds = 0.0  # the tower's time

    @property
    def delta(self) -> int:
        return self.rope.delta

    @property
    def tokens(self) -> int:
        """The prompt's image tokens."""
        return sum(image.tokens for image in self.images)

    def chunk(self, begin: int, end: int) -> ChunkInput:
        """The input of the tokens begin .. end - 1."""
        self._run_tower(begin)
        weight = next(self.embed_tokens.parameters())
        ids = torch.tensor(self.ids[begin:end], dtype=torch.long, device=weight.device)
        embeds = self.embed_tokens(ids)
        for i, (start, image) in enumerate(zip(self.starts, self.images, strict=True)):
            lo, hi = max(begin, start), min(end, start + image.tokens)
            if lo < hi:
                embeds[lo - begin : hi - begin] = self._features[i][lo - start : hi - start].to(embeds.dtype)
        positions = self.rope.positions.to(weight.device)
        before = positions[:, max(begin - 1, 0) : end - 1]
        if begin == 0:  # nothing precedes the first token: its pair row is dropped
            before = torch.cat((positions[:, :1], before), dim=1)
        return ChunkInput(embeds, positions[:, begin:end], before)

    def _run_tower(self, begin: int) -> None:
        """The features of every image that ends past `begin` (at the first chunk), the tower run once per image:
        its activations are then those of the largest image, as the memory model budgets
        (engine/memory.py vision_workspace_bytes), not of all a prompt's images at once."""
        wanted = [
            i
            for i, (start, image) in enumerate(zip(self.starts, self.images, strict=True))
            if start + image.tokens > begin and i not in self._features
        ]
        if not wanted:
            return
        started = time.perf_counter()
        for i in wanted:
            self._features[i] = self.tower(self.images[i].pixels, [self.images[i].grid])
        if self._features[wanted[-1]].device.type == "cuda":
            torch.cuda.synchronize(self._features[wanted[-1]].device)
        self.seconds += time.perf_counter() - started


def _run_starts(keys: list[int], images: Sequence[PromptImage]) -> list[int]:
    """Where each image's run of tokens starts in `keys` (the same image twice has two runs)."""
    starts, at = [], 0
    for image in images:
        at = keys.index(image.key, at)
        starts.append(at)
        at += image.tokens
    return starts
