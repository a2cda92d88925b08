"""Prompts with images through `Engine.generate`, on a tiny random Qwen3.5 vision-language checkpoint (float32).

The decoded tokens after images must be the reference's (transformers' Qwen3_5ForConditionalGeneration, in float64,
on the same weights: the decode steps rotate each at its index plus the prompt's M-RoPE offset); every drafting
method must answer exactly as plain decoding; and an image must be part of the prompt's identity: a next turn
reuses what the engine holds, the same text with another image does not, and a parked conversation comes back
only for its own image, answering as a cold prefill does.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from dflash_chat.engine.events import Finished, Prefilled, Step
from dflash_chat.engine.images import expand_ids, prepare
from dflash_chat.engine.load import load_drafter, load_mtp, load_target, load_vision
from dflash_chat.engine.lookup import PromptLookup
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.mtp_reference import ReferenceMTP
from tests.engine.test_mtp import _mtp_weights
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


@pytest.fixture(scope="module")
def vlm_moe(tmp_path_factory):
    """The MoE twin, as `vlm` gives it (no drafters)."""
    root = tmp_path_factory.mktemp("vlm-moe")
    return write_vlm(root / "target", "qwen3_5_moe", seed=4), root / "target", None, None


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


@pytest.mark.parametrize("checkpoint", ["vlm", "vlm_moe"])
def test_decoded_tokens_after_images_match_transformers(checkpoint, request):
    vlm = request.getfixturevalue(checkpoint)
    model = copy.deepcopy(vlm[0]).double()  # float32 weights, the reference computed in float64
    if checkpoint == "vlm_moe":
        model.set_experts_implementation("eager")  # grouped_mm takes no float64
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
    assert finished.stats.image_tokens == sum(image.tokens for image in images) == ids.count(IMAGE_TOKEN)
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
    second, reused, finished = _answer(engine, turn, images + new)
    assert reused == held
    assert finished.stats.vision_s > 0 and finished.stats.image_tokens == images[0].tokens + new[0].tokens
    assert patches == [images[0].pixels.shape[0], new[0].pixels.shape[0]]  # the first image ran once
    assert second == _answer(_engine(vlm), turn, images + new)[0]  # as a cold prefill answers


def test_the_tower_reads_a_prompts_images_one_at_a_time(vlm):
    """Its activations are one image's, as the memory model budgets (engine/memory.py vision_workspace_bytes),
    however many images the prompt holds."""
    engine = _engine(vlm)
    assert engine.vision is not None
    patches: list[int] = []
    engine.vision.register_forward_hook(lambda _m, args, _out: patches.append(args[0].shape[0]))
    ids, images = _prompt(engine, list(pictures()))
    _answer(engine, ids, images)
    assert patches == [image.pixels.shape[0] for image in images] and len(patches) == 2


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


def test_mtp_drafts_after_images_are_the_reference_layers(vlm):
    """The MTP layer on an image prompt as vLLM runs Qwen3.5's: a row whose next token is an image's takes its
    image features as that token's embedding, and every row the target's M-RoPE position of its own token. After
    the prompt, its newest hidden state is the target's and its drafts are an independent reference's."""
    model, folder, *_ = vlm
    engine = _engine(vlm, "mtp", draft=3)
    ids, images = _prompt(engine, pictures())
    first = _answer(engine, ids, images, n=1)[0][0]
    seen: dict = {}
    language = model.model.language_model
    hook = language.register_forward_pre_hook(lambda _m, _a, kwargs: seen.update(kwargs), with_kwargs=True)
    sequence = torch.tensor(ids)
    try:
        with torch.no_grad():
            hidden = model.model(
                input_ids=sequence[None],
                pixel_values=torch.cat([image.pixels for image in images]),
                image_grid_thw=torch.tensor([image.grid for image in images]),
                mm_token_type_ids=(sequence == IMAGE_TOKEN).int()[None],
            ).last_hidden_state[0]
    finally:
        hook.remove()
    embeds, positions = seen["inputs_embeds"][0], seen["position_ids"][:, 0]  # as the target got them
    mtp = engine.mtp
    assert mtp is not None
    torch.testing.assert_close(mtp.last[0], hidden[-1], rtol=0, atol=1e-4)
    reference = ReferenceMTP(
        model.config.text_config, _mtp_weights(folder), language.embed_tokens.weight.detach(), model.lm_head.weight
    )
    want = reference.chain(hidden, ids + [first], 3, embeds=embeds[1:], positions=positions)
    bound = engine.state.max_len
    drafts = mtp.propose(
        torch.tensor([first]), torch.tensor(len(ids)), bound, SamplingParams(), None, None, 3, engine.steps.delta
    )
    assert drafts.tolist() == want


def test_dflash_drafts_after_images_are_zlabs_at_the_targets_temporal_positions(vlm):
    """The DFlash drafter on an image prompt as vLLM runs it: its context keys rotate at the target's temporal
    M-RoPE positions, its block at the committed length plus the prompt's offset. Its draft logits after the
    prompt are z-lab's drafter's (tests/engine/vendor) on transformers' hidden states at those positions."""
    from transformers import AttentionInterface, DynamicCache, Qwen3Config

    from tests.engine.test_drafter_reference import _layer_causal, _zlab_attention
    from tests.engine.vendor.zlab_dflash_model import DFlashDraftModel, extract_context_feature

    model, folder, dflash, _ = vlm
    engine = _engine(vlm, "dflash", dflash, draft=5)
    ids, images = _prompt(engine, pictures())
    first = _answer(engine, ids, images, n=1)[0][0]
    drafter = engine.drafter
    assert drafter is not None
    B, n, delta = drafter.block_size, len(ids), int(engine.steps.delta)
    assert delta < 0
    block = drafter.block_ids(torch.device("cpu"))
    block[0] = first
    span = Span.fixed(torch.tensor(n), torch.arange(B), engine.state.max_len, engine.steps.delta)
    ours = drafter.draft_logits(block, span)

    seen: dict = {}
    language = model.model.language_model
    hook = language.register_forward_pre_hook(lambda _m, _a, kwargs: seen.update(kwargs), with_kwargs=True)
    sequence = torch.tensor(ids)
    try:
        with torch.no_grad():
            states = model.model(
                input_ids=sequence[None],
                pixel_values=torch.cat([image.pixels for image in images]),
                image_grid_thw=torch.tensor([image.grid for image in images]),
                mm_token_type_ids=(sequence == IMAGE_TOKEN).int()[None],
                output_hidden_states=True,
            ).hidden_states
    finally:
        hook.remove()
    temporal = seen["position_ids"][0, 0]
    cfg = json.loads((dflash / "config.json").read_text())
    config = Qwen3Config(**cfg)
    config.block_size = B
    AttentionInterface.register("zlab_07ebd93_reference", _zlab_attention)
    config._attn_implementation = "zlab_07ebd93_reference"
    ref = DFlashDraftModel(config).eval()
    ref.load_state_dict(load_file(str(dflash / "model.safetensors")), strict=False)
    for layer, causal in zip(ref.layers, _layer_causal(cfg), strict=True):
        layer.self_attn.is_causal = causal
    features = extract_context_feature(states, cfg["dflash_config"]["target_layer_ids"])
    positions = torch.cat((temporal, n + delta + torch.arange(B)))[None]
    with torch.no_grad():
        hidden = ref(
            target_hidden=features,
            noise_embedding=language.embed_tokens(block)[None],
            position_ids=positions,
            past_key_values=DynamicCache(),
            use_cache=True,
        )
        want = model.lm_head(hidden[0, 1 - B :])
    torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)
