"""Where the embedded demo pair lives: a tiny trained target and its drafters, shipped as data.

They are built by `python -m dflash_chat.train demo` (see dflash_chat/train/) and need no GPU and no
download. They are a tiny demo model: fine for trying the app and measuring DFlash, not for real work.
Two drafters ship beside the target: the DFlash one (drafter/) and a DFlash2 one made from it
(drafter2/). `demo.json` names the one `--demo` runs, the faster in `bench --demo` (which measures both).
A vision tower ships beside them (vision/, written by the recipe's `vision` stage, train/vision.py): random weights
that see nothing meaningful, there so that images go the whole way through the demo (the chat, `serve --demo`).
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_chat.errors import UserError

DEMO_NAME = "dflash-chat demo (tiny, trained on the Python standard library)"


def demo_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "demo_data"


DRAFTER_DIRS = {"dflash": "drafter", "dflash2": "drafter2"}  # kind -> folder in demo_data
CHOICE_FILE = "demo.json"
HELDOUT_FILE = "heldout_prompts.json"  # written beside a shipped pair by the training recipe's ship stage
TOOL_PROMPTS_FILE = "tool_prompts.json"  # the held-out tool chats, written by the recipe's tools stage
VISION_DIR = "vision"  # the demo's random vision tower, a model folder of `visual.*` tensors


def demo_heldout_prompts() -> list[list[dict]]:
    """The held-out chats shipped beside the demo pair (never seen in training)."""
    return json.loads((demo_dir() / HELDOUT_FILE).read_text())


def demo_tool_chats() -> list[dict]:
    """The held-out tool chats shipped beside the demo pair (their tools' names never trained on), as
    records: tools (OpenAI's shape), request, call (name and arguments, or None), result."""
    return json.loads((demo_dir() / TOOL_PROMPTS_FILE).read_text())["chats"]


def demo_paths(kind: str | None = None) -> tuple[Path, Path]:
    """(target_dir, drafter_dir) of the embedded demo pair (the drafter of `kind`, default the chosen one);
    UserError when this install lacks it."""
    if kind is not None:
        target, drafter = demo_dir() / "target", demo_dir() / DRAFTER_DIRS[kind]
        if not (_complete(target) and _complete(drafter)):
            raise UserError(
                f"the tiny demo's {kind} drafter is not part of this build ({drafter} is missing or "
                "incomplete): reinstall dflash-chat"
            )
        return target, drafter
    if not demo_available():
        raise UserError(
            f"the tiny demo model is not part of this build ({demo_dir()} is missing or incomplete): "
            "pass --target DIR --drafter DIR instead, or reinstall dflash-chat"
        )
    return _paths()


def demo_available() -> bool:
    target, drafter = _paths()
    return _complete(target) and _complete(drafter) and (target / "tokenizer.json").is_file()


def demo_drafters() -> dict[str, Path]:
    """kind -> folder of every complete drafter shipped with the demo target, DFlash first."""
    return {kind: demo_dir() / name for kind, name in DRAFTER_DIRS.items() if _complete(demo_dir() / name)}


def chosen_kind() -> str:
    """The drafter `--demo` runs: the one demo.json names when it ships, else DFlash."""
    try:
        kind = json.loads((demo_dir() / CHOICE_FILE).read_text()).get("drafter")
    except (OSError, ValueError, AttributeError):
        return "dflash"
    return kind if kind in demo_drafters() else "dflash"


def demo_vision() -> Path | None:
    """The demo's vision tower folder, or None when this build lacks it or the demo target's tokenizer lacks the
    image token (a target shipped without the recipe's vision stage): the demo then reads no images, and loads."""
    folder = demo_dir() / VISION_DIR
    if not (_complete(folder) and (folder / "preprocessor_config.json").is_file()):
        return None
    try:
        tokens = (demo_dir() / "target" / "tokenizer.json").read_text(encoding="utf-8")
    except OSError:
        return None
    return folder if '"<|image_pad|>"' in tokens else None


def _complete(directory: Path) -> bool:
    return (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()


def _paths() -> tuple[Path, Path]:
    root = demo_dir()
    return root / "target", root / DRAFTER_DIRS[chosen_kind()]
