"""Where the embedded demo pair lives: a tiny trained target and its DFlash drafter, shipped as data.

They are built by `python -m dflash_chat.train demo` (see dflash_chat/train/) and need no GPU and no
download. They are a tiny demo model: fine for trying the app and measuring DFlash, not for real work.
"""

from __future__ import annotations

from pathlib import Path

DEMO_NAME = "dflash-chat demo (tiny, trained on the Python standard library)"


def demo_dir() -> Path:
    return Path(__file__).resolve().parent / "demo_data"


def demo_paths() -> tuple[Path, Path]:
    """(target_dir, drafter_dir) of the embedded demo pair."""
    root = demo_dir()
    return root / "target", root / "drafter"


def demo_available() -> bool:
    target, drafter = demo_paths()
    return all((d / "config.json").is_file() and (d / "model.safetensors").is_file() for d in (target, drafter)) and (
        (target / "tokenizer.json").is_file()
    )
