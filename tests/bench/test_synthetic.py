"""Random packed weights at real shapes (bench/synthetic_models.py) and `bench --synthetic` on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dflash_chat.bench import synthetic_models
from dflash_chat.engine.ggml.formats import FORMATS, dequantize


def test_the_q4_k_m_mix_is_llama_cpps():
    fmt = lambda name, shape, mix="Q4_K_M": synthetic_models.weight_format(name, shape, mix, 64)  # noqa: E731
    assert fmt("lm_head.weight", (248320, 5120)) is FORMATS["Q6_K"]
    assert fmt("model.embed_tokens.weight", (248320, 5120)) is FORMATS["Q4_K"]
    # attn_v / attn_qkv / ffn_down: Q6_K in the first and last eighth and every third layer between
    bumped = [i for i in range(64) if fmt(f"model.layers.{i}.mlp.down_proj.weight", (5120, 17408)) is FORMATS["Q6_K"]]
    assert bumped[:10] == [0, 1, 2, 3, 4, 5, 6, 7, 10, 13] and bumped[-8:] == list(range(56, 64))
    assert fmt("model.layers.10.linear_attn.in_proj_qkv.weight", (10240, 5120)) is FORMATS["Q6_K"]
    assert fmt("model.layers.11.linear_attn.in_proj_qkv.weight", (10240, 5120)) is FORMATS["Q4_K"]
    assert fmt("model.layers.10.mlp.gate_proj.weight", (17408, 5120)) is FORMATS["Q4_K"]
    # rows that are not whole 256-value blocks fall back; norms, conv, router and 1-row gates stay float
    assert fmt("model.layers.0.x.weight", (64, 2080)) is FORMATS["Q8_0"]
    for name, shape in [
        ("model.norm.weight", (5120,)),
        ("model.layers.0.linear_attn.conv1d.weight", (10240, 1, 4)),
        ("model.layers.0.mlp.gate.weight", (256, 2048)),
        ("model.layers.0.mlp.shared_expert_gate.weight", (1, 2048)),
    ]:
        assert fmt(name, shape) is None
    assert fmt("lm_head.weight", (248320, 5120), "Q8_0") is FORMATS["Q8_0"]
    assert fmt("lm_head.weight", (248320, 5120), "bf16") is None


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0"])
def test_random_blocks_are_small_and_finite(name):
    fmt = FORMATS[name]
    t = synthetic_models.random_packed(fmt, (3, 512), "cpu", torch.Generator().manual_seed(0))
    values = dequantize(t.data, fmt)
    assert values.shape == (3, 512) and values.isfinite().all()
    assert 0 < values.abs().max() < 1.0


def test_cut_models_keep_both_layer_kinds_and_valid_taps():
    target = synthetic_models.target_config("qwen3.6-27b", layers=2)
    assert target.layer_types == ["linear_attention", "full_attention"]
    drafter = synthetic_models.drafter_config("qwen3.6-27b", 2, vocab=4096)
    assert drafter.num_layers == 2 and drafter.layer_types == ["sliding_attention", "full_attention"]
    assert all(0 <= t < 2 for t in drafter.target_layer_ids) and drafter.mask_token_id == 4095
    full = synthetic_models.drafter_config("qwen3.6-35b-a3b", 40)
    assert full.target_layer_ids == [1, 6, 11, 16, 22, 27, 32, 37] and full.sliding_window == 4096


def test_bytes_per_token_counts_the_routed_experts_a_token_picks():
    synthetic_models.TARGETS["tiny-moe"] = dict(
        synthetic_models.TARGETS["qwen3.6-35b-a3b"],
        vocab_size=512,
        hidden_size=256,
        num_experts=16,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
    )
    try:
        model = synthetic_models.build_target("tiny-moe", "Q8_0", layers=2)
    finally:
        del synthetic_models.TARGETS["tiny-moe"]
    experts = [m for m in model.modules() if type(m).__name__ == "QuantExperts"]
    expert_bytes = sum(b.numel() for m in experts for b in m.buffers())
    everything = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    embed = model.model.embed_tokens.packed.numel()
    assert (
        synthetic_models.bytes_per_token(model)
        == everything - embed + embed // 512 - expert_bytes + expert_bytes * 2 // 16
    )


def test_the_vision_tower_is_the_catalogs_and_is_cut_with_the_target():
    from dflash_chat.models.catalog import load_catalog

    for name in synthetic_models.TARGETS:
        cfg, shape = synthetic_models.vision_config(name), load_catalog().get(name).vision
        assert shape is not None
        assert (cfg.depth, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.out_hidden_size) == (
            shape.depth,
            shape.hidden,
            shape.intermediate,
            shape.heads,
            shape.out_hidden,
        )
    depths = [synthetic_models.vision_config("qwen3.6-27b", n).depth for n in (1, 2, 16, 64, None)]
    assert depths == [1, 1, 7, 27, 27]


def test_a_1024x768_image_is_768_tokens_within_the_budget():
    """As the reference processor sizes it: 1024 x 768 is whole 32-pixel blocks within Qwen3.5's pixel budget, so
    48 x 64 patches, 768 merged tokens."""
    from dflash_chat.bench.synthetic_vision import random_image
    from dflash_chat.engine.images import prepare
    from dflash_chat.engine.models.vision import VisionTower

    with torch.device("meta"):
        tower = VisionTower(synthetic_models.vision_config("qwen3.6-27b"))
    (image,) = prepare([random_image(1024, 768, 0)], tower)
    assert image.grid == (1, 48, 64) and image.tokens == 768 and image.pixels.shape == (3072, 1536)


@pytest.mark.slow(seconds=100)
def test_bench_synthetic_runs_on_the_cpu(tmp_path):
    """The issue's smoke run: real 27B layer shapes, two layers, every figure printed and saved; with an image, the
    vision tower at its real width (one block, cut with the layers) beside the prefill of the same prompt. One
    timed call per step figure (--repeats 1): each is a second or more here, and the figures' values are not
    what is checked."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_chat.cli",
            "bench",
            "--synthetic",
            "qwen3.6-27b",
            "--layers",
            "2",
            "--tokens",
            "6",
            "--threads",
            "1",
            "--repeats",
            "1",
            "--image",
            "64x48",
            "--json",
            "--save",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["model"] == "qwen3.6-27b" and figures["layers"] == 2 and figures["device"] == "cpu"
    assert figures["weight_bytes_per_token"] > 2e9  # two 27B layers, a 4096-token vocabulary, float32
    for key in ("ar_step_ms", "ar_floor_ms", "verify_ms", "draft_ms", "copy_bytes_per_s", "ar_tokens_per_s"):
        assert figures[key] > 0, key
    assert all(n > 0 for n in figures["kernels_per_step"].values())
    runs = {(d["draft"], d["forced_acceptance_length"]): d for d in figures["dflash"]}
    assert set(runs) == {("15", 1), ("15", 3), ("15", 6), ("auto", 1), ("auto", 6)}
    assert all(d["identical_to_ar"] for d in runs.values())
    # the decode loop's own host time per step, apart from the steps' entry points: every kind of step it ran
    assert figures["ar_loop_host_us_per_step"] > 0 and figures["mtp_loop_host_us_per_step"] > 0
    assert all(d["loop_host_us_per_step"] > 0 and d["loop_host_us_by_method"] for d in runs.values())
    assert set(runs["15", 6]["loop_host_us_by_method"]) <= {"dflash", "plain"}
    whole = {n: runs["15", n] for n in (1, 3, 6)}
    assert whole[6]["mean_acceptance_length"] > whole[3]["mean_acceptance_length"] > whole[1]["mean_acceptance_length"]
    assert runs["auto", 1]["mean_draft_length"] < whole[1]["mean_draft_length"]  # no drafts accepted: auto drafts less
    # the target's own MTP layer: a draft step chained 1-3 deep against a plain step; deeper costs more, and one
    # chained forward reads less than a plain step (one layer and the head against two layers and the head)
    mtp = figures["mtp"]
    assert list(mtp) == ["1", "2", "3"] and 0 < mtp["1"]["draft_ms"] < mtp["3"]["draft_ms"]
    assert figures["mtp_step_over_ar"] == mtp["1"]["over_ar_step"] > 0 and 0 < figures["mtp_bytes_over_ar"] < 1
    # a small image is scaled up to the budget's least pixels (65536): 320 x 224, 20 x 14 patches, 70 tokens
    vision = figures["vision"]
    assert vision["images"] == [{"size": [64, 48], "resized": [320, 224], "grid": [1, 14, 20], "tokens": 70}]
    assert vision["image_tokens"] == 70 and vision["patches"] == 280
    assert (vision["depth"], vision["full_depth"]) == (1, 27) and vision["prompt_tokens"] == 70 + 32
    assert 0 < vision["weight_bytes"] < vision["full_weight_bytes"]
    for key in ("tower_ms", "tower_in_prefill_ms", "prefill_ms", "tower_peak_bytes", "prefill_peak_bytes"):
        assert vision[key] > 0, key
    # the tower's working memory: at least its output (70 rows of 5120 in float32), within the memory model's bound
    assert 70 * 5120 * 4 <= vision["tower_peak_bytes"] <= vision["tower_peak_estimate_bytes"]
    assert 0 < vision["tower_share"] < 1
    saved = list(tmp_path.glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["date"] == figures["date"]
