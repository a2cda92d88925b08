"""The last stage: what the others made, copied out as the shipped demo pair."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dflash_chat.models.demo import HELDOUT_FILE, TOOL_PROMPTS_FILE
from dflash_chat.models.sizes import size_text
from dflash_chat.train.common import Log
from dflash_chat.train.stages.prepare import load_corpus
from dflash_chat.train.vision import vision_stage


def ship(work: Path, out: Path, log: Log = print) -> None:
    """Copy what the stages made into `out` (target/ with tokenizer files, drafter/, drafter2/, the held-out
    tool chats), then the vision stage on it (train/vision.py: the target's vision tokens, the demo's tower)."""
    for name in ("target", "drafter", "drafter2"):
        if not (work / name).is_dir():
            continue
        dest = out / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(work / name, dest)
    if (work / TOOL_PROMPTS_FILE).is_file():
        shutil.copyfile(work / TOOL_PROMPTS_FILE, out / TOOL_PROMPTS_FILE)
    if (out / "target").is_dir():
        vision_stage(out, log=log)  # a target shipped without its vision tokens would leave the demo's tower unread
    prompts = [c.prompt_messages for c in load_corpus(work / "corpus.json").heldout]
    (out / HELDOUT_FILE).write_text(json.dumps(prompts, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"shipped the demo pair to {out} ({size_text(size)})")
