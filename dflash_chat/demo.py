"""Where the embedded demo pair lives: a tiny trained target and its DFlash drafter, shipped as data.

They are built by `python -m dflash_chat.train demo` (see dflash_chat/train/) and need no GPU and no
download. They are a tiny demo model: fine for trying the app and measuring DFlash, not for real work.
"""

from __future__ import annotations

from pathlib import Path

from dflash_chat.errors import UserError

DEMO_NAME = "dflash-chat demo (tiny, trained on the Python standard library)"


def demo_dir() -> Path:
    return Path(__file__).resolve().parent / "demo_data"


def demo_paths() -> tuple[Path, Path]:
    """(target_dir, drafter_dir) of the embedded demo pair; UserError when this install lacks it."""
    if not demo_available():
        raise UserError(
            f"the tiny demo model is not part of this build ({demo_dir()} is missing or incomplete): "
            "pass --target DIR --drafter DIR instead, or reinstall dflash-chat"
        )
    return _paths()


def demo_available() -> bool:
    target, drafter = _paths()
    return all((d / "config.json").is_file() and (d / "model.safetensors").is_file() for d in (target, drafter)) and (
        (target / "tokenizer.json").is_file()
    )


def _paths() -> tuple[Path, Path]:
    root = demo_dir()
    return root / "target", root / "drafter"
