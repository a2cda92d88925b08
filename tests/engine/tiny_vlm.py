"""A tiny random Qwen3.5 vision-language checkpoint for the image-prompt tests: transformers'
Qwen3_5ForConditionalGeneration saved as the HF folders are, with an MTP layer shipped inside it as Qwen's
checkpoints ship theirs, its preprocessing, random DFlash / DFlash2 drafters for its text model, and a tokenizer
whose chat template writes an image part as Qwen3.5's does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from dflash_chat.bench.tiny_target import _randomise, mtp_state_dict, target_config
from dflash_chat.engine.models.vision_input import ImageConfig
from tests.engine.tiny import write_drafter

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 390, 391, 392, 393
VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,
}
# factor 8 px; images of 16-50 px take 4-32 tokens
IMAGES = ImageConfig(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=256, max_pixels=2048)
# Qwen3.5's render_content for a content of parts: `<|vision_start|><|image_pad|><|vision_end|>` per image part
CHAT_TEMPLATE = (
    "{%- macro render(content) -%}{%- if content is string -%}{{- content -}}{%- else -%}"
    "{%- for item in content -%}"
    "{%- if 'image' in item or item.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item.type == 'text' -%}{{- item.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + render(m.content) + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
)


def text_config(arch: str) -> dict:
    cfg = target_config(arch, 400)
    cfg["head_dim"] = 32  # a rotary of 8 channels: 4 frequencies, split 2 / 1 / 1 over temporal, height, width
    cfg["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    }
    return cfg


def write_vlm(folder: Path, arch: str = "qwen3_5", seed: int = 0):
    """The checkpoint in `folder` (with an MTP layer); returns the transformers model (float32, eval)."""
    import transformers as tf
    from safetensors.torch import load_file, save_file

    tf.utils.logging.set_verbosity_error()
    classes = {
        "qwen3_5": (tf.Qwen3_5Config, tf.Qwen3_5ForConditionalGeneration),
        "qwen3_5_moe": (tf.Qwen3_5MoeConfig, tf.Qwen3_5MoeForConditionalGeneration),
    }
    config_cls, model_cls = classes[arch]
    text = text_config(arch)
    config = config_cls(
        text_config=text,
        vision_config=VISION,
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    _randomise(model, torch.Generator().manual_seed(seed + 1), 1.0, zero_centred=True)
    folder = Path(folder)
    model.save_pretrained(folder)
    weights = folder / "model.safetensors"
    mtp = mtp_state_dict(text | {"model_type": model.config.text_config.model_type}, seed=seed + 2)
    save_file({**load_file(str(weights)), **mtp}, str(weights), metadata={"format": "pt"})
    saved = json.loads((folder / "config.json").read_text())
    saved["text_config"]["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(saved, indent=2))
    preprocessing = {
        "patch_size": IMAGES.patch_size,
        "merge_size": IMAGES.merge_size,
        "temporal_patch_size": IMAGES.temporal_patch_size,
        "size": {"shortest_edge": IMAGES.min_pixels, "longest_edge": IMAGES.max_pixels},
        "image_mean": list(IMAGES.image_mean),
        "image_std": list(IMAGES.image_std),
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessing))
    return model


def write_vlm_tokenizer(folder: Path) -> None:
    """The bench's tiny tokenizer with the vision tokens at the checkpoint's ids, and CHAT_TEMPLATE."""
    from transformers import PreTrainedTokenizerFast

    from dflash_chat.bench.tiny_target import write_tokenizer

    write_tokenizer(folder)
    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    fillers = [f"<|unused_{i}|>" for i in range(IMAGE_TOKEN - len(tok))]
    vision = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    tok.add_special_tokens({"additional_special_tokens": fillers + vision})
    assert tok.convert_tokens_to_ids(vision) == [IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END]
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(folder))


def write_drafters(root: Path, arch: str = "qwen3_5", seed: int = 0) -> tuple[Path, Path]:
    """(DFlash, DFlash2) drafter folders for the text model of `arch`'s checkpoint."""
    root = Path(root)
    flat = root / "text"
    flat.mkdir(parents=True, exist_ok=True)
    (flat / "config.json").write_text(json.dumps(text_config(arch)))
    write_drafter(root / "dflash", flat, seed=seed, block_size=8)
    write_drafter(root / "dflash2", flat, seed=seed + 1, block_size=8, dflash2=True)
    return root / "dflash", root / "dflash2"


def pictures(seed: int = 0):
    """Two images of different sizes and aspect ratios: a landscape RGB and a tall one with transparency."""
    from PIL import Image

    gen = np.random.default_rng(seed)
    wide = Image.fromarray(gen.integers(0, 256, (24, 40, 3), dtype=np.uint8))
    tall = Image.fromarray(gen.integers(0, 256, (48, 16, 4), dtype=np.uint8), mode="RGBA")
    return [wide, tall]


def template_ids(images: int) -> list[int]:
    """A prompt as a chat template writes it: text, one placeholder per image between vision start and end, text
    that repeats the prompt's first words (prompt lookup matches them, and what followed them is an image)."""
    ids = [5, 17, 3]
    for _ in range(images):
        ids += [VISION_START, IMAGE_TOKEN, VISION_END, 44, 9]
    return ids + [7, 8, 100, 5, 17]
