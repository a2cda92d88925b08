"""Whether a pick loads its vision tower, and why, in one line.

The tower never changes the pick: images are a part of some chats, the model and its context are every chat's.
With the `vision` setting `auto`, the tower loads where its memory (engine/memory.py vision_bytes: its weights,
and what reading the largest image needs beyond the engine's workspace) fits in what the pick leaves (its state
and margin kept); where memory is tight it stays unloaded and the line says why, e.g. "not loaded: the tower needs
2.65 GB and 928 MB is left beside the pick at a 32k context; a shorter --context or a smaller quant makes room for
it (images are refused meanwhile)". `dflash-chat models` and `doctor` print it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from dflash_chat.engine import memory
from dflash_chat.models.catalog import Pair, Source
from dflash_chat.models.sizes import size_text


class Budget(Protocol):
    """What the picker's budget (models/hardware.py, which imports this module) tells of the room left."""

    @property
    def fits(self) -> bool: ...
    @property
    def need(self) -> int: ...
    @property
    def available(self) -> int: ...
    @property
    def workspace(self) -> int: ...


# sizes a tower for a pair the catalog knows none of (`--mmproj` beside a user's own pair): Qwen3.5's
QWEN35_TOWER = dict(depth=27, hidden=1152, intermediate=4304, heads=16)


@dataclass(frozen=True)
class VisionPick:
    """Whether the pick loads the vision tower, from where, what it takes, and why (`line`)."""

    loads: bool
    why: str  # "loaded (...)", "not loaded: ...", "off (...)"
    source: Source | None = None  # the mmproj file (or the safetensors target folder) it loads from
    need: int = 0  # bytes it adds to the pick's budget

    @property
    def line(self) -> str:
        """One line for `models` and `doctor`: 'Vision: loaded (...)' / 'Vision: not loaded: ...'."""
        return f"Vision: {self.why}"


NO_VISION = VisionPick(False, "not loaded: this model has no vision tower in the catalog")


def plan_vision(
    pair: Pair,
    target: Source,
    budget: Budget,
    where: str,
    e: int,
    setting: str = "auto",
    mmproj_file: str | Path | None = None,
) -> VisionPick:
    """Whether the pick (`pair`'s `target`, whose `budget` is sized for the context `where` names, computing in `e`
    bytes) loads its tower: never under `off`, nor for a pair without one; else where the tower's memory fits in
    what the pick leaves."""
    if setting == "off":
        return VisionPick(False, "off (the vision setting); images are refused")
    shape = pair.vision
    if shape is None and mmproj_file:
        shape = memory.VisionShape(**QWEN35_TOWER, out_hidden=pair.target_shape.hidden)
    if shape is None:
        return NO_VISION
    source = mmproj_source(mmproj_file) if mmproj_file else pair.vision_source(target)
    if source is None:
        return VisionPick(False, f"not loaded: {pair.title} names no vision tower file; pass --mmproj FILE")
    if not budget.fits:
        return VisionPick(False, f"not loaded: the model itself does not fit in the {size_text(budget.available)} free")
    need = memory.vision_bytes(shape, budget.workspace, e)
    left = budget.available - budget.need
    if need > left:
        return VisionPick(
            False,
            f"not loaded: the tower needs {size_text(need)} and {size_text(left)} is left beside the pick at {where}; "
            "a shorter --context or a smaller quant makes room for it (images are refused meanwhile)",
        )
    weights = memory.vision_weight_bytes(shape, e)
    return VisionPick(
        True,
        f"loaded ({size_text(weights)} of weights + {size_text(need - weights)} while it reads a "
        f"{shape.max_pixels / 2**20:.3g}-megapixel image; {size_text(left - need)} to spare)",
        source,
        need,
    )


def mmproj_source(path: str | Path) -> Source:
    """A vision tower GGUF on disk (`--mmproj FILE`)."""
    return replace(Source.local(Path(path).expanduser()), kind="mmproj", quant="")
