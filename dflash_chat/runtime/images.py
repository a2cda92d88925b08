"""Images in chat turns, as the model's chat template and the engine take them.

A turn's content may be a list of parts, as Qwen's template reads them: `{"type": "text", "text": ...}` and
`{"type": "image", "image": <a Pillow image>}`. The template writes `<|vision_start|><|image_pad|><|vision_end|>`
for each image part; the pair's vision tower prepares the images (engine/images.py: its preprocessing and each
image's content hash) and each placeholder is repeated to its image's token count, as the reference processor
does. Decoding files and refusing bad ones is the caller's: this module takes Pillow images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_chat.engine.end_tokens import IMAGE_PAD
from dflash_chat.errors import UserError

if TYPE_CHECKING:
    from dflash_chat.engine.images import PromptImage
    from dflash_chat.engine.models.vision import VisionTower

__all__ = ["IMAGE_PAD", "Vision", "image_part", "turn_images", "with_images"]


@dataclass(frozen=True)
class Vision:
    """What a prompt's images need of the loaded pair: its vision tower and the placeholder token's id."""

    tower: VisionTower
    image_token_id: int


def image_part(image: Any) -> dict[str, Any]:
    """A turn's content part holding a Pillow image."""
    return {"type": "image", "image": image}


def turn_images(turns: Sequence[dict[str, Any]]) -> list[Any]:
    """The Pillow images of the turns' image parts, in the order the template writes them."""
    return [
        part["image"]
        for turn in turns
        if isinstance(turn.get("content"), list)
        for part in turn["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    ]


def with_images(
    ids: list[int], images: Sequence[Any], vision: Vision | None
) -> tuple[list[int], tuple[PromptImage, ...]]:
    """(ids with each image's placeholder expanded, the images prepared for the engine) of a rendering of turns whose
    image parts are `images`; a model that cannot show them is a UserError that says so."""
    if not images:
        return ids, ()
    if vision is None:
        raise UserError("this model reads no images (it has no vision tower): send the message without them")
    written = ids.count(vision.image_token_id)
    if written != len(images):
        raise UserError(
            f"the chat template wrote {written} image placeholders for {len(images)} images: "
            "use the model's own chat template, which shows images"
        )
    from dflash_chat.engine.images import expand_ids, prepare

    try:
        prepared = prepare(images, vision.tower)
    except ValueError as exc:
        raise UserError(f"an image cannot be shown to the model: {exc}") from None
    return expand_ids(ids, vision.image_token_id, prepared), tuple(prepared)
