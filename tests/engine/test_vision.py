"""The vision tower and prompts with images, against transformers on tiny random checkpoints (float32).

Qwen3_5ForConditionalGeneration (and its MoE twin) is the reference: our target (float32), with the tower's features
spliced into its embeddings and M-RoPE positions, must give its logits within 1e-4 for prompts with one image and
with two of different sizes. The reference runs the same float32 weights in float64: its own float32 run carries
6e-5 to 1e-4 of rounding on these prompts (its chunked Gated DeltaNet; the figure depends on the CPU's kernels), ours
about as much, so ours must be within twice the reference's own float32 rounding, measured on this machine
(`atol`), and never looser than needed: 1e-4 where the rounding is smaller. Our preprocessing must give its image processor's pixels, and a tower
loaded from an mmproj GGUF in llama.cpp's converter layout must equal the one loaded from the HF folder.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash_chat.bench.tiny_target import _randomise
from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.load import load_target, load_vision
from dflash_chat.engine.models.image_prompt import build, expand, rope_positions
from dflash_chat.engine.models.vision import VisionConfig, merged_tokens
from dflash_chat.engine.models.vision_input import ImageConfig, preprocess
from tests.engine.gguf_write import write_mmproj_gguf, write_target_gguf
from tests.engine.tiny_vlm import IMAGE_TOKEN, IMAGES, VIDEO_TOKEN, VISION, VISION_END, VISION_START, text_config


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def vlm(request, tmp_path_factory):
    """(HF model, its folder) of a tiny random Qwen3.5 (or MoE) with a vision tower."""
    import transformers as tf

    tf.utils.logging.set_verbosity_error()
    classes = {
        "qwen3_5": (tf.Qwen3_5Config, tf.Qwen3_5ForConditionalGeneration),
        "qwen3_5_moe": (tf.Qwen3_5MoeConfig, tf.Qwen3_5MoeForConditionalGeneration),
    }
    config_cls, model_cls = classes[request.param]
    config = config_cls(
        text_config=text_config(request.param),
        vision_config=VISION,
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    torch.manual_seed(0)
    model = model_cls(config).eval()
    _randomise(model, torch.Generator().manual_seed(1), 1.0, zero_centred=True)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    model.set_experts_implementation("eager")  # grouped_mm takes no float64
    return model.double(), folder  # float32 weights, exactly; the reference computed in float64


@pytest.fixture(scope="module")
def atol(vlm) -> float:
    """Twice transformers' own float32 rounding (its float32 run against its float64 one) on the two-image prompt,
    at least 1e-4."""
    import copy

    model, _ = vlm
    pixels, grids = preprocess(_images(), IMAGES)
    ids = _expanded(grids)
    with torch.no_grad():
        exact = _reference(model, ids, pixels, grids).logits[0]
        rounded = _reference(copy.deepcopy(model).float(), ids, pixels.float(), grids, dtype=torch.float32)
    return max(1e-4, 2 * float((rounded.logits[0].double() - exact).abs().max()))


def _images():
    """Two images of different sizes and aspect ratios: a landscape RGB and a tall one with transparency."""
    from PIL import Image

    gen = np.random.default_rng(0)
    wide = Image.fromarray(gen.integers(0, 256, (24, 40, 3), dtype=np.uint8))
    tall = Image.fromarray(gen.integers(0, 256, (90, 30, 4), dtype=np.uint8), mode="RGBA")
    return [wide, tall]


def _visual(model) -> dict[str, torch.Tensor]:
    """The tower's tensors as the mmproj writer takes them (`model.visual.` taken off)."""
    return {k.removeprefix("model.visual."): v for k, v in model.state_dict().items() if k.startswith("model.visual.")}


def _prompt(counts) -> list[int]:
    """Text, then each image's placeholders (counts[i] of them) between vision start and end, then more text."""
    ids = [5, 17, 3]
    for count in counts:
        ids += [VISION_START] + [IMAGE_TOKEN] * count + [VISION_END, 44, 9]
    return ids + [7, 8, 100]


def _expanded(grids) -> torch.Tensor:
    """The prompt as transformers' processor expands it for images of `grids`."""
    return torch.tensor(_prompt([merged_tokens(VisionConfig.from_dict(VISION), g) for g in grids]))


def _reference(model, ids, pixels, grids, dtype=torch.float64, **kwargs):
    return model(
        input_ids=ids[None],
        pixel_values=pixels.to(dtype),
        image_grid_thw=torch.tensor(grids),
        mm_token_type_ids=(ids == IMAGE_TOKEN).int()[None],
        **kwargs,
    )


def _ours(target, tower, images):
    """Our logits for the prompt with one placeholder per image (as the chat template writes it), the rope
    positions and the state after it."""
    tower.images = IMAGES
    prompt = build(_prompt([1] * len(images)), images, tower, target.model.embed_tokens, IMAGE_TOKEN)
    state = target.new_state(256)
    logits, _ = target(prompt.ids, state, logits="all", embeds=prompt.embeds, rope_positions=prompt.rope.positions)
    return logits, prompt, state


@pytest.mark.parametrize("count", [1, 2])
def test_image_prompt_logits_match_transformers(vlm, count, atol):
    model, folder = vlm
    images = _images()[:count]
    pixels, grids = preprocess(images, IMAGES)
    ids = _expanded(grids)
    with torch.no_grad():
        ref = _reference(model, ids, pixels, grids, use_cache=True)
    target = load_target(folder, "cpu", torch.float32)
    logits, prompt, state = _ours(target, load_vision(folder, "cpu", torch.float32), images)
    assert torch.equal(prompt.ids, ids)  # each placeholder expanded as the processor does
    torch.testing.assert_close(logits.double(), ref.logits[0], atol=atol, rtol=0)
    rope = prompt.rope

    # the next token rotates at its sequence index plus the prompt's delta, as generate() does
    nxt = torch.tensor([int(ref.logits[0, -1].argmax())])
    with torch.no_grad():
        ref_next = model(input_ids=nxt[None], cache=ref.cache, use_cache=True).logits[0]
    n = ids.shape[0]
    ours_next, _ = target(nxt, state, logits="all", rope_positions=torch.full((3, 1), n + rope.delta))
    assert rope.delta < 0  # an image of N tokens takes fewer than N positions
    torch.testing.assert_close(ours_next.double(), ref_next, atol=atol, rtol=0)


def test_a_prompt_continued_in_parts_answers_as_in_one(vlm):
    """The held tokens' delta carries over: a prompt run as two forwards, an image in each, gives the logits of one
    forward over the whole (what prefix reuse relies on)."""
    _, folder = vlm
    target = load_target(folder, "cpu", torch.float32)
    tower = load_vision(folder, "cpu", torch.float32)
    tower.images = IMAGES
    wide, tall = _images()
    whole = build(_prompt([1, 1]), [wide, tall], tower, target.model.embed_tokens, IMAGE_TOKEN)
    first_ids = _prompt([1])[:-3]  # up to the text after the first image
    first = build(first_ids, [wide], tower, target.model.embed_tokens, IMAGE_TOKEN)
    rest_ids = [VISION_START, IMAGE_TOKEN, VISION_END, 44, 9, 7, 8, 100]
    n = first.ids.shape[0]
    rest = build(rest_ids, [tall], tower, target.model.embed_tokens, IMAGE_TOKEN, start=n, delta=first.rope.delta)
    assert torch.equal(torch.cat([first.ids, rest.ids]), whole.ids)
    assert torch.equal(torch.cat([first.rope.positions, rest.rope.positions], dim=1), whole.rope.positions)
    assert rest.rope.delta == whole.rope.delta
    state = target.new_state(256)
    parts = [
        target(p.ids, state, logits="all", embeds=p.embeds, rope_positions=p.rope.positions)[0] for p in (first, rest)
    ]
    at_once = target(
        whole.ids, target.new_state(256), logits="all", embeds=whole.embeds, rope_positions=whole.rope.positions
    )[0]
    torch.testing.assert_close(torch.cat(parts), at_once, atol=1e-4, rtol=0)  # as test_parity's incremental runs


def test_gguf_pair_matches_transformers(vlm, tmp_path, atol):
    """A target GGUF and an mmproj GGUF (F32, as llama.cpp's converter writes them) answer an image prompt as the
    reference does: the text model's M-RoPE sections come from `rope.dimension_sections`."""
    model, _ = vlm
    state = model.state_dict()
    text = {"model." + k.removeprefix("model.language_model."): v for k, v in state.items() if "language_model." in k}
    text["lm_head.weight"] = state["lm_head.weight"]
    target_path = write_target_gguf(tmp_path / "target.gguf", text, model.config.text_config.to_dict(), "F32")
    mmproj_path = write_mmproj_gguf(tmp_path / "mmproj.gguf", _visual(model), VISION, 64, "F32")
    images = _images()
    pixels, grids = preprocess(images, IMAGES)
    with torch.no_grad():
        ref = _reference(model, _expanded(grids), pixels, grids).logits[0]
    target = load_target(target_path, "cpu", torch.float32)
    assert target.cfg.mrope_section == (2, 1, 1)
    logits, _, _ = _ours(target, load_vision(mmproj_path, "cpu", torch.float32), images)
    torch.testing.assert_close(logits.double(), ref, atol=atol, rtol=0)


def test_text_prompt_still_rotates_by_position(vlm, atol):
    """Without images the target ignores the tower and gives the reference's text-only logits."""
    model, folder = vlm
    ids = torch.tensor([5, 17, 3, 44, 9, 7, 8, 100, 12, 13])
    with torch.no_grad():
        ref = model(input_ids=ids[None]).logits[0]
    target = load_target(folder, "cpu", torch.float32)
    logits, _ = target(ids, target.new_state(64), logits="all")
    torch.testing.assert_close(logits.double(), ref, atol=atol, rtol=0)
    rope = rope_positions(ids, IMAGE_TOKEN, [], 2)
    assert rope.delta == 0 and torch.equal(rope.positions, torch.arange(10).expand(3, -1))


def _processor(cfg: ImageConfig):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=cfg.patch_size,
        merge_size=cfg.merge_size,
        temporal_patch_size=cfg.temporal_patch_size,
        image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std),
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
    )


def _assert_preprocessed_alike(images, cfg: ImageConfig) -> None:
    reference = _processor(cfg)
    for image in images:
        want = reference(images=[image], return_tensors="np")
        pixels, grids = preprocess([image], cfg)
        assert grids == [tuple(int(v) for v in want["image_grid_thw"][0])]
        np.testing.assert_array_equal(pixels.numpy(), want["pixel_values"])


def test_preprocessing_equals_the_image_processor():
    """Pixels and grids as transformers' Qwen2VLImageProcessor (Pillow) makes them, for RGB, RGBA, grey and
    palette images, one scaled up to the budget's floor and one down into its ceiling."""
    from PIL import Image

    gen = np.random.default_rng(3)
    grey = Image.fromarray(gen.integers(0, 256, (33, 17), dtype=np.uint8), mode="L")
    palette = Image.fromarray(gen.integers(0, 256, (50, 70, 3), dtype=np.uint8)).convert("P")
    tiny = Image.fromarray(gen.integers(0, 256, (9, 12, 3), dtype=np.uint8))
    _assert_preprocessed_alike([*_images(), grey, palette, tiny], IMAGES)


def test_preprocessing_with_qwen35s_own_config():
    """Qwen3.5's published preprocessor_config.json (patch 16, merge 2, 256^2 to 4096^2 px, mean and std 0.5): a
    photo-sized image resized to multiples of 32 and a small one scaled up to the budget's floor."""
    from PIL import Image

    gen = np.random.default_rng(4)
    photo = Image.fromarray(gen.integers(0, 256, (700, 1000, 3), dtype=np.uint8))
    small = Image.fromarray(gen.integers(0, 256, (80, 100, 3), dtype=np.uint8))
    cfg = ImageConfig.from_dict(
        {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "merge_size": 2}
    )
    assert cfg == ImageConfig()
    _assert_preprocessed_alike([photo, small], cfg)
    assert preprocess([photo], cfg)[1] == [(1, 44, 62)]  # 704 x 992 px


@pytest.mark.parametrize("ftype", ["F32", "F16", "BF16", "Q8_0"])
def test_mmproj_gguf_loads_the_same_tower(vlm, tmp_path, ftype):
    """An mmproj GGUF written as llama.cpp's converter writes it loads into the HF-loaded tower: exactly in F32, and
    with the file's own rounding in F16, BF16 and Q8_0 (each tensor equal to what the gguf package decodes)."""
    import gguf

    model, folder = vlm
    visual = _visual(model)
    path = write_mmproj_gguf(tmp_path / f"mmproj-{ftype}.gguf", visual, VISION, 64, ftype)
    from_hf = load_vision(folder, "cpu", torch.float32)
    from_gguf = load_vision(path, "cpu", torch.float32)
    assert from_gguf.cfg == from_hf.cfg
    reader = gguf.GGUFReader(path)
    decoded = {t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()) for t in reader.tensors}
    ours = from_gguf.state_dict()
    assert torch.equal(ours["blocks.1.attn.qkv.weight"], decoded["v.blk.1.attn_qkv.weight"].reshape(96, 32).float())
    assert torch.equal(ours["merger.linear_fc2.weight"], decoded["mm.2.weight"].reshape(64, 128).float())
    patch = torch.stack([decoded["v.patch_embd.weight"], decoded["v.patch_embd.weight.1"]], dim=2)
    assert torch.equal(ours["patch_embed.proj.weight"], patch.reshape(32, 3, 2, 4, 4).float())
    pixels, grids = preprocess(_images(), IMAGES)
    tolerance = {"F32": 1e-5, "F16": 2e-2, "BF16": 1e-1, "Q8_0": 5e-2}[ftype]
    torch.testing.assert_close(from_gguf(pixels, grids), from_hf(pixels, grids), atol=tolerance, rtol=0)
    if ftype == "F32":
        assert all(torch.equal(ours[k], v) for k, v in from_hf.state_dict().items())


def test_the_loaded_tower_preprocesses_as_its_files_say(vlm, tmp_path):
    """The folder's preprocessor_config.json (pixel budget, mean, std), and an mmproj's mean and std; patch and merge
    sizes are always the tower's own."""
    import json
    import shutil

    model, folder = vlm
    local = tmp_path / "with-processor"
    shutil.copytree(folder, local)
    declared = {"size": {"shortest_edge": 256, "longest_edge": 2048}, "patch_size": 4, "merge_size": 2}
    (local / "preprocessor_config.json").write_text(json.dumps({**declared, "image_mean": [0.25] * 3}))
    images = load_vision(local, "cpu", torch.float32).images
    assert (images.min_pixels, images.max_pixels, images.image_mean, images.patch_size) == (256, 2048, (0.25,) * 3, 4)
    visual = _visual(model)
    clip_mean, clip_std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    path = write_mmproj_gguf(tmp_path / "mmproj.gguf", visual, VISION, 64, "F32", clip_mean, clip_std)
    images = load_vision(path, "cpu", torch.float32).images
    np.testing.assert_allclose(images.image_mean + images.image_std, clip_mean + clip_std, rtol=1e-6)
    assert (images.patch_size, images.merge_size, images.max_pixels) == (4, 2, 16777216)


def test_bad_vision_files_are_refused_in_one_line(vlm, tiny_dirs, tmp_path):
    model, folder = vlm
    with pytest.raises(ModelFormatError, match="has no vision_config: this model reads no images"):
        load_vision(tiny_dirs["qwen3_5"][0], "cpu", torch.float32)
    partial = {k: v for k, v in _visual(model).items() if k != "blocks.1.attn.qkv.weight"}
    path = write_mmproj_gguf(tmp_path / "partial.gguf", partial, VISION, 64, "F32")
    with pytest.raises(ModelFormatError, match="lacks tensors v.blk.1.attn_qkv.weight: the file is incomplete"):
        load_vision(path, "cpu", torch.float32)
    path = write_mmproj_gguf(tmp_path / "deepstack.gguf", _visual(model), VISION, 64, "F32", deepstack=[True, False])
    with pytest.raises(ModelFormatError, match="deepstack layers"):
        load_vision(path, "cpu", torch.float32)
    other = tmp_path / "other-width.gguf"
    write_mmproj_gguf(other, _visual(model), {**VISION, "out_hidden_size": 128}, 128, "F32")
    target = load_target(folder, "cpu", torch.float32)
    with pytest.raises(ModelFormatError, match="128-wide features, the target's hidden size is 64"):
        load_vision(other, target=target)
    assert load_vision(folder, target=target).merger.linear_fc2.weight.dtype == torch.float32


def test_mmproj_of_another_projector_is_refused(tmp_path):
    import gguf

    path = tmp_path / "mmproj-other.gguf"
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_clip_projector_type("gemma3")
    writer.add_tensor("v.patch_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFormatError, match="gemma3"):
        load_vision(path, "cpu", torch.float32)


def test_placeholders_that_do_not_fit_the_images_are_refused():
    with pytest.raises(ValueError, match="2 image placeholders for 1 images"):
        expand([IMAGE_TOKEN, 1, IMAGE_TOKEN], IMAGE_TOKEN, [4])
    grids = [(1, 4, 4)]  # 4 tokens
    with pytest.raises(ValueError, match="fewer placeholders"):
        rope_positions([1, IMAGE_TOKEN, IMAGE_TOKEN, 2], IMAGE_TOKEN, grids, 2)
    with pytest.raises(ValueError, match="more images"):
        rope_positions([1, 2], IMAGE_TOKEN, grids, 2)
    with pytest.raises(ValueError, match="more image placeholders"):
        rope_positions([1, IMAGE_TOKEN], IMAGE_TOKEN, [], 2)


def test_a_folder_pair_loads_its_own_tower_unless_told_not_to(vlm, tmp_path):
    """load_pair: a Hugging Face folder whose config has a vision_config brings its tower (the pair reads images);
    `vision=False` (the setting off, or no room for it) loads none; a GGUF target has none of its own."""
    import shutil

    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.models.vision import VisionTower
    from tests.engine.tiny_vlm import write_vlm_tokenizer

    _, folder = vlm
    local = tmp_path / "vlm"
    shutil.copytree(folder, local)
    write_vlm_tokenizer(local)
    pair = load_pair(local, None, device="cpu", max_context=64, speculate="none")
    assert isinstance(pair.vision, VisionTower) and pair.vision.cfg == VisionConfig.from_dict(VISION)
    assert load_pair(local, None, device="cpu", max_context=64, speculate="none", vision=False).vision is None
