"""Chat turns with images through the runtime, on a tiny random Qwen3.5 vision-language pair loaded as users load
one: the chat template writes one placeholder per image part, the prompt carries the images with each placeholder
expanded to its image's tokens, the session hands them to the engine, and the next turn continues the tokens the
engine holds (its new image added, the earlier ones reused)."""

from __future__ import annotations

import threading

import pytest
import torch

from dflash_chat.engine.events import Prefilled
from dflash_chat.engine.images import expand_ids, prepare
from dflash_chat.engine.load import load_pair
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.errors import UserError
from dflash_chat.runtime.images import Vision, image_part, with_images
from dflash_chat.runtime.prompt import build_prompt, encode
from dflash_chat.runtime.session import EngineSession
from tests.engine.tiny_vlm import IMAGE_TOKEN, IMAGES, pictures, write_vlm, write_vlm_tokenizer

PARAMS = SamplingParams(max_new_tokens=8)  # greedy


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vlm-pair") / "target"
    write_vlm(folder, seed=7)
    write_vlm_tokenizer(folder)
    return load_pair(folder, None, device="cpu", dtype=torch.float32, max_context=256, speculate="mtp", draft=3)


def _turn(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}


def test_the_pair_loads_its_own_vision_tower(pair):
    assert pair.vision is not None
    assert pair.vision.images == IMAGES  # the folder's preprocessor_config.json
    assert pair.engine.image_token_id == IMAGE_TOKEN


def test_an_image_turn_renders_one_placeholder_run_per_image(pair):
    session = EngineSession(pair)
    wide, tall = pictures()
    prompt = session.chat_prompt([_turn(image_part(wide), "what are these?", image_part(tall))], False, None)
    assert prompt.text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    expected = prepare([wide, tall], pair.vision)
    assert [image.digest for image in prompt.images] == [image.digest for image in expected]
    assert prompt.ids == expand_ids(encode(pair.tokenizer, prompt.text), IMAGE_TOKEN, expected)
    assert prompt.ids.count(IMAGE_TOKEN) == sum(image.tokens for image in expected)


def test_a_session_answers_an_image_turn_and_its_next_turn_reuses_it(pair):
    session = EngineSession(pair)
    wide, tall = pictures()
    turns = [_turn(image_part(wide), "what is it?")]
    prompt = session.chat_prompt(turns, False, None)
    events: list = []
    end = session.answer(prompt, PARAMS, threading.Event(), lambda chunk: None, tap=events.append)
    assert end.reason in ("length", "stop")
    assert next(e for e in events if isinstance(e, Prefilled)).prompt_tokens == len(prompt.ids)
    held = session.held(turns, prompt, end)
    assert held is not None
    turns = [*turns, {"role": "assistant", "content": end.answer}, _turn("and this?", image_part(tall))]
    following = session.chat_prompt(turns, False, held)
    assert following.ids[: len(held.ids)] == held.ids  # continued, not rendered afresh
    assert following.images[:1] == prompt.images and len(following.images) == 2
    events.clear()
    session.answer(following, PARAMS, threading.Event(), lambda chunk: None, tap=events.append)
    reused = next(e for e in events if isinstance(e, Prefilled)).reused_tokens
    assert reused >= len(prompt.ids)  # the first image's tokens came from the held state


def test_images_the_model_cannot_show_are_refused_in_one_line(pair):
    wide, _ = pictures()
    ids = [1, IMAGE_TOKEN, 2]
    with pytest.raises(UserError, match="reads no images"):
        with_images(ids, [wide], None)
    vision = Vision(pair.vision, IMAGE_TOKEN)
    with pytest.raises(UserError, match="wrote 0 image placeholders for 1 images"):
        with_images([1, 2], [wide], vision)
    plain = pair.tokenizer
    template, plain.chat_template = plain.chat_template, "{%- for m in messages -%}{{- m.role -}}{%- endfor -%}"
    try:  # a template that drops the parts (the demo's writes no content that is not a string)
        with pytest.raises(UserError, match="image placeholders"):
            build_prompt(plain, [_turn(image_part(wide), "hi")], thinking=False, vision=vision)
    finally:
        plain.chat_template = template


def test_a_chat_the_template_refuses_is_refused_in_one_line(pair):
    """Qwen3.5's template raises for an image in the system turn: one line, no traceback."""
    tokenizer = pair.tokenizer
    template = tokenizer.chat_template
    tokenizer.chat_template = (
        "{%- for m in messages -%}{%- if m.role == 'system' and m.content is not string -%}"
        "{{- raise_exception('System message cannot contain images.') -}}{%- endif -%}{%- endfor -%}"
    )
    wide, _ = pictures()
    try:
        with pytest.raises(UserError, match="System message cannot contain images"):
            build_prompt(tokenizer, [{"role": "system", "content": [image_part(wide)]}], thinking=False)
    finally:
        tokenizer.chat_template = template
