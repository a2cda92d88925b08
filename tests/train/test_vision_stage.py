"""The demo's vision tower and tokens (train/vision.py): what ships is what the recipe makes, the tower loads with the
demo pair and turns an image into prompt tokens, and the vision tokens change no text's encoding."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from dflash_chat.models.demo import demo_dir, demo_vision
from dflash_chat.train.vision import VISION_TOKENS, add_vision_tokens, write_demo_tower

pytestmark = pytest.mark.skipif(demo_vision() is None, reason="the demo's vision tower is not in demo_data")


def test_the_shipped_tower_is_the_recipes(tmp_path):
    shipped = demo_vision()
    assert shipped is not None
    hidden = json.loads((demo_dir() / "target" / "config.json").read_text())["hidden_size"]
    made = write_demo_tower(tmp_path / "vision", hidden, seed=0)
    ours, theirs = load_file(str(made / "model.safetensors")), load_file(str(shipped / "model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    for name in ("config.json", "preprocessor_config.json"):
        assert (made / name).read_text() == (shipped / name).read_text()
    assert sum(p.stat().st_size for p in shipped.iterdir()) < 512 * 1024  # small enough to ship in the wheel


def test_the_vision_tokens_take_bytes_no_text_holds():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_dir() / "target"))
    ids = tok.convert_tokens_to_ids(list(VISION_TOKENS))
    assert ids == [189, 190, 191] and len(tok) == 6146  # the bytes' ids: the vocabulary did not grow
    text = "ý þ ÿ \xfd\xfe\xff naïve 日本 🎉"  # the characters whose byte-level letters the tokens took
    assert not set(tok.encode(text, add_special_tokens=False)) & set(ids)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.encode("<|vision_start|><|image_pad|><|vision_end|>", add_special_tokens=False) == [189, 191, 190]


def test_adding_the_tokens_again_changes_nothing(tmp_path):
    folder = tmp_path / "target"
    shutil.copytree(demo_dir() / "target", folder, ignore=shutil.ignore_patterns("*.safetensors"))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    add_vision_tokens(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_the_template_writes_an_image_part_as_qwens():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_dir() / "target"))
    parts = [{"type": "text", "text": "what is "}, {"type": "image", "image": None}, {"type": "text", "text": "?"}]
    text = tok.apply_chat_template([{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=False)
    assert text == "<|im_start|>user\nwhat is <|vision_start|><|image_pad|><|vision_end|>?<|im_end|>\n"


def test_a_target_shipped_without_the_vision_tokens_leaves_the_tower_unloaded(tmp_path, monkeypatch):
    """A target shipped by hand, past the recipe's vision stage: the demo names no tower, so it loads without one and
    reads no images (its tokenizer has no image token to place an image's features at), rather than failing."""
    from dflash_chat.models import demo

    root = tmp_path / "demo_data"
    shutil.copytree(demo_dir() / "vision", root / "vision")
    (root / "target").mkdir(parents=True)
    monkeypatch.setattr(demo, "demo_dir", lambda: root)
    (root / "target" / "tokenizer.json").write_text('{"added_tokens": [{"content": "<|im_start|>"}]}')
    assert demo.demo_vision() is None
    (root / "target" / "tokenizer.json").write_text('{"added_tokens": [{"content": "<|image_pad|>"}]}')
    assert demo.demo_vision() == root / "vision"
