"""Prompts with images through `Engine.generate`, on a tiny random Qwen3.5 vision-language checkpoint (float32).

The decoded tokens after images must be the reference's (transformers' Qwen3_5ForConditionalGeneration, in float64,
on the same weights: the decode steps rotate each at its index plus the prompt's M-RoPE offset); every drafting
method must answer exactly as plain decoding; and an image must be part of the prompt's identity: a next turn
reuses what the engine holds, the same text with another image does not, and a parked conversation comes back
only for its own image, answering as a cold prefill does.
"""

from __future__ import annotations

import copy

import pytest
import torch

from dflash_chat.engine.events import Finished, Prefilled, Step
from dflash_chat.engine.images import expand_ids, prepare
from dflash_chat.engine.load import load_drafter, load_mtp, load_target, load_vision
from dflash_chat.engine.lookup import PromptLookup
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.tiny_vlm import (
    IMAGE_TOKEN,
    IMAGES,
    VISION_END,
    VISION_START,
    pictures,
    template_ids,
    write_drafters,
    write_vlm,
)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """(transformers model, checkpoint folder, DFlash drafter folder, DFlash2 drafter folder)."""
    root = tmp_path_factory.mktemp("vlm")
    model = write_vlm(root / "target", seed=3)
    dflash, dflash2 = write_drafters(root / "drafters", seed=5)
    return model, root / "target", dflash, dflash2


def _engine(vlm, speculate: str = "none", drafter=None, **kwargs) -> Engine:
    _, folder, *_ = vlm
    target = load_target(folder, "cpu", torch.float32)
    tower = load_vision(folder, target=target)
    tower.images = IMAGES
    return Engine(
        target,
        load_drafter(drafter, target) if drafter is not None else None,
        mtp=load_mtp(folder, target),
        max_context=256,
        speculate=speculate,
        vision=tower,
        image_token_id=IMAGE_TOKEN,
        **kwargs,
    )


def _prompt(engine: Engine, images, placeholders: int | None = None):
    """(expanded ids, prepared images) of the test prompt with `images`."""
    assert engine.vision is not None
    prepared = prepare(images, engine.vision)
    return expand_ids(
        template_ids(len(images) if placeholders is None else placeholders), IMAGE_TOKEN, prepared
    ), prepared


def _answer(engine: Engine, ids, images, n: int = 24) -> tuple[list[int], int, Finished]:
    """(tokens, reused tokens, the Finished event) of a greedy answer."""
    tokens, reused, finished = [], -1, None
    for event in engine.generate(ids, SamplingParams(max_new_tokens=n), images=images):
        if isinstance(event, Prefilled):
            reused = event.reused_tokens
        elif isinstance(event, Step):
            tokens.extend(event.token_ids)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None and finished.reason in ("length", "stop"), finished
    return tokens, reused, finished


def test_decoded_tokens_after_images_match_transformers(vlm):
    model = copy.deepcopy(vlm[0]).double()  # float32 weights, the reference computed in float64
    engine = _engine(vlm)
    ids, images = _prompt(engine, pictures())
    tokens, _, _ = _answer(engine, ids, images, n=4)
    assert engine.snapshot is not None and engine.snapshot.logits is not None
    first = engine.snapshot.logits  # the prefill's: the first answer token's
    fourth = engine.steps.outputs[1][0][0]  # the last plain decode step's: the fourth's, at index len + 2
    sequence = torch.tensor(ids + tokens[:3])
    with torch.no_grad():
        ref = model(
            input_ids=sequence[None],
            pixel_values=torch.cat([image.pixels for image in images]).double(),
            image_grid_thw=torch.tensor([image.grid for image in images]),
            mm_token_type_ids=(sequence == IMAGE_TOKEN).int()[None],
        ).logits[0]
    n = len(ids)
    torch.testing.assert_close(first.double(), ref[n - 1], atol=1e-4, rtol=0)
    torch.testing.assert_close(fourth.double(), ref[n + 2], atol=1e-4, rtol=0)
    assert ref[n - 1 :].argmax(-1).tolist() == tokens


@pytest.fixture(scope="module")
def plain(vlm):
    """The plain greedy answer to the two-image prompt."""
    engine = _engine(vlm)
    ids, images = _prompt(engine, pictures())
    return _answer(engine, ids, images)[0]


@pytest.mark.parametrize(
    ("speculate", "drafter"),
    [("dflash", "dflash"), ("dflash", "dflash2"), ("mtp", None), ("lookup", None), ("auto", "dflash2")],
)
def test_speculative_answer_equals_plain_decoding(vlm, plain, speculate, drafter):
    folders = {"dflash": vlm[2], "dflash2": vlm[3]}
    engine = _engine(vlm, speculate, folders.get(drafter), draft=5)
    ids, images = _prompt(engine, pictures())
    tokens, _, finished = _answer(engine, ids, images)
    assert tokens == plain
    if speculate in ("dflash", "mtp"):
        assert finished.stats.drafted > 0


def test_next_turn_reuses_the_prefix_and_runs_the_tower_on_its_new_image_only(vlm):
    engine = _engine(vlm, "auto", vlm[3], draft=5)
    assert engine.vision is not None
    patches: list[int] = []
    engine.vision.register_forward_hook(lambda _m, args, _out: patches.append(args[0].shape[0]))
    wide, tall = pictures()
    ids, images = _prompt(engine, [wide])
    answer, _, _ = _answer(engine, ids, images)
    held = len(engine.tokens)
    new = prepare([tall], engine.vision)
    turn = ids + answer + expand_ids([11, VISION_START, IMAGE_TOKEN, VISION_END, 12], IMAGE_TOKEN, new)
    second, reused, _ = _answer(engine, turn, images + new)
    assert reused == held
    assert patches == [images[0].pixels.shape[0], new[0].pixels.shape[0]]  # the first image ran once
    assert second == _answer(_engine(vlm), turn, images + new)[0]  # as a cold prefill answers


def test_the_same_text_with_another_image_reuses_nothing_past_it(vlm):
    engine = _engine(vlm, "auto", vlm[3], draft=5)
    wide, _ = pictures(0)
    other, _ = pictures(1)  # the same size: the same placeholder ids
    ids_a, images_a = _prompt(engine, [wide])
    ids_b, images_b = _prompt(engine, [other])
    assert ids_a == ids_b and images_a[0].key != images_b[0].key
    _answer(engine, ids_a, images_a)
    tokens, reused, _ = _answer(engine, ids_b, images_b)
    assert reused <= ids_b.index(IMAGE_TOKEN)
    assert tokens == _answer(_engine(vlm), ids_b, images_b)[0]


def test_a_parked_image_conversation_comes_back_for_its_own_image_only(vlm):
    engine = _engine(vlm, "auto", vlm[3], draft=5)
    engine.shelf.min_tokens = 8  # tiny conversations are worth parking here
    wide, _ = pictures(0)
    other, _ = pictures(1)
    ids_a, images_a = _prompt(engine, [wide])
    ids_b, images_b = _prompt(engine, [other])
    answer_a, _, _ = _answer(engine, ids_a, images_a)
    held_a = len(engine.tokens)
    side = [60 + i for i in range(20)]
    _answer(engine, side, [])  # another conversation: the image one is parked
    assert len(engine.shelf) == 1
    tokens_b, reused, _ = _answer(engine, ids_b, images_b)  # its placeholders, another image
    assert reused <= ids_b.index(IMAGE_TOKEN)
    assert tokens_b == _answer(_engine(vlm), ids_b, images_b)[0]
    turn = ids_a + answer_a + [11, 12, 13]
    tokens, reused, _ = _answer(engine, turn, images_a)  # the first conversation's next turn: unparked
    assert reused == held_a
    assert tokens == _answer(_engine(vlm), turn, images_a)[0]


def test_bad_image_prompts_are_refused_in_one_line(vlm):
    engine = _engine(vlm)
    ids, images = _prompt(engine, pictures())
    with pytest.raises(ValueError, match="came without its images"):
        next(engine.generate(ids, SamplingParams(max_new_tokens=2)))
    with pytest.raises(ValueError, match="more images"):
        next(engine.generate(ids, SamplingParams(max_new_tokens=2), images=images + images[:1]))
    text_only = Engine(engine.target, None, max_context=256, speculate="none")
    with pytest.raises(ValueError, match="no vision tower"):
        next(text_only.generate(ids, SamplingParams(max_new_tokens=2), images=images))


def test_prompt_lookup_never_proposes_an_image():
    """An image's tokens are held as a negative key: a match whose continuation reaches one stops before it."""
    lookup = PromptLookup()
    lookup.extend([5, 17, 3, -9, -9, 44, 5, 17])
    match = lookup.propose(4)
    assert match is not None and match.tokens == [3]
    right_before = PromptLookup()
    right_before.extend([5, 17, -9, -9, 5, 17])
    assert right_before.propose(4) is None
