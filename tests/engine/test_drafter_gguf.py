"""DFlash drafter GGUFs in both schemas draft exactly like the safetensors drafter they came from.

The shipped demo pair is the vehicle: its drafter is trained, so a drafter reading the wrong target
layers or a wrong norm shows in what it proposes and in how much the target accepts (a random drafter
is accepted about never, right or wrong). The GGUFs are written as the two converters write them
(`write_drafter_gguf`: the DFlash fork's `dflash-draft`, mainline llama.cpp's `dflash`), in BF16 as
`convert_hf_to_gguf.py --outtype auto` writes a BF16 checkpoint, so every weight is bit for bit the same.
"""

from __future__ import annotations

import json
import shutil

import gguf
import pytest
import torch
from safetensors.torch import load_file

from dflash_chat.engine.events import Step
from dflash_chat.engine.load import load_drafter, load_target, load_tokenizer
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from dflash_chat.models.demo import demo_paths
from dflash_chat.runtime.prompt import build_prompt
from tests.engine.gguf_write import write_drafter_gguf


@pytest.fixture(scope="module")
def demo():
    target_dir, drafter_dir = demo_paths("dflash")  # the DFlash drafter: these are the DFlash schemas
    tokenizer = load_tokenizer(target_dir)
    prompts = json.loads((target_dir.parent / "heldout_prompts.json").read_text())[:3]
    return {
        "target": load_target(target_dir, "cpu", torch.float32),
        "tokenizer": tokenizer,
        "drafter_dir": drafter_dir,
        "state": load_file(str(drafter_dir / "model.safetensors")),
        "config": json.loads((drafter_dir / "config.json").read_text()),
        "prompts": [build_prompt(tokenizer, chat, thinking=False).ids for chat in prompts],
    }


def _trace(demo, drafter) -> list[tuple[tuple[int, ...], int, int]]:
    """Every verify step of greedy answers to the prompts: (tokens committed, drafted, accepted)."""
    engine = Engine(demo["target"], drafter, max_context=1024, draft=15)  # every step the same size: traces compare
    steps = []
    for prompt in demo["prompts"]:
        for event in engine.generate(prompt, SamplingParams(max_new_tokens=48)):
            if isinstance(event, Step):
                steps.append((tuple(event.token_ids), event.drafted, event.accepted))
        engine.reset()
    return steps


def _fields(path) -> dict:
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.t")} | {
        "tensors": {t.name for t in reader.tensors}
    }


def _demo_gguf(demo, path, schema: str):
    """The demo drafter in BF16 as `schema`'s converter writes it (mainline's marking the M-RoPE target)."""
    return write_drafter_gguf(
        path,
        demo["state"],
        demo["config"],
        "BF16",
        schema=schema,
        tokenizer=demo["tokenizer"],
        mrope_target=schema == "dflash",
    )


@pytest.fixture(scope="module")
def reference(demo):
    return _trace(demo, load_drafter(demo["drafter_dir"], demo["target"]))


def test_the_fork_schema_file_is_shaped_as_its_converter_writes_it(demo, tmp_path):
    path = _demo_gguf(demo, tmp_path / "fork.gguf", "dflash-draft")
    kv = _fields(path)
    assert kv["general.architecture"] == "dflash-draft"
    assert kv["dflash-draft.dflash.target_layer_ids"] == [1, 3, 5]  # HF's ids as they are
    assert kv["dflash-draft.dflash.mask_token_id"] == 3 and kv["dflash-draft.attention.causal"] is False
    assert {
        "dflash_fc.weight",
        "dflash_hidden_norm.weight",
        "output_norm.weight",
        "blk.0.post_attention_norm.weight",
    } <= kv["tensors"]
    assert not {"token_embd.weight", "output.weight"} & kv["tensors"]


def test_the_mainline_schema_file_is_shaped_as_its_converter_writes_it(demo, tmp_path):
    path = _demo_gguf(demo, tmp_path / "mainline.gguf", "dflash")
    kv = _fields(path)
    assert kv["general.architecture"] == "dflash"
    assert kv["dflash.target_layers"] == [2, 4, 6]  # HF's [1, 3, 5] plus one
    assert kv["tokenizer.ggml.mask_token_id"] == 3 and kv["dflash.block_size"] == 16
    assert not any("causal" in k or "mask_token_id" in k and k.startswith("dflash") for k in kv)
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight", "blk.0.ffn_norm.weight"} <= kv["tensors"]
    assert not {"token_embd.weight", "output.weight", "blk.0.post_attention_norm.weight"} & kv["tensors"]


@pytest.mark.parametrize("schema", ["dflash-draft", "dflash"])
def test_gguf_drafter_drafts_exactly_like_its_safetensors(demo, reference, schema, tmp_path):
    path = _demo_gguf(demo, tmp_path / f"{schema}.gguf", schema)
    drafter = load_drafter(path, demo["target"])
    assert drafter.target_layer_ids == [1, 3, 5] and drafter.mask_token_id == 3
    assert [layer.self_attn.causal for layer in drafter.layers] == [False]  # one full layer
    got = _trace(demo, drafter)
    assert got == reference
    assert sum(accepted for *_, accepted in got) > len(got)  # a trained drafter: more than one token a step


def test_a_wrong_tap_shows_in_acceptance(demo, reference, tmp_path):
    """What an off-by-one in the taps would cost: the test above would see it."""
    folder = tmp_path / "shifted"
    shutil.copytree(demo["drafter_dir"], folder)
    cfg = dict(demo["config"], dflash_config=dict(demo["config"]["dflash_config"], target_layer_ids=[0, 2, 4]))
    (folder / "config.json").write_text(json.dumps(cfg))
    shifted = _trace(demo, load_drafter(folder, demo["target"]))
    accepted = sum(a for *_, a in shifted)
    assert shifted != reference
    assert accepted < 0.9 * sum(a for *_, a in reference)  # seen: 88 against 107


def test_a_drafter_through_llama_quantize_drafts_like_the_converter_output(demo, tmp_path):
    from tests.engine.gguf_write import quantize_like_llama

    bf16 = write_drafter_gguf(
        tmp_path / "bf16.gguf", demo["state"], demo["config"], "BF16", schema="dflash", tokenizer=demo["tokenizer"]
    )
    quantized = quantize_like_llama(bf16, tmp_path / "q8.gguf", "Q8_0")
    direct = write_drafter_gguf(tmp_path / "direct.gguf", demo["state"], demo["config"], "Q8_0", schema="dflash")
    assert _trace(demo, load_drafter(quantized, demo["target"])) == _trace(demo, load_drafter(direct, demo["target"]))


def _drafts(drafter, target) -> torch.Tensor:
    """Draft hidden states over contexts longer than the sliding window (8), in three steps."""
    gen = torch.Generator().manual_seed(6)
    features = torch.randn(40, 2 * target.cfg.hidden_size, generator=gen)
    drafter.allocate(64)
    out = []
    for start, end in ((0, 13), (13, 14), (14, 30)):
        drafter.append_context(features[start:end], end)
        out.append(drafter.draft_hidden(7, end))
    return torch.cat(out)


@pytest.mark.parametrize(
    "schema, is_causal, key, causal",
    [
        ("dflash", None, None, [True, False]),  # mainline says nothing: each layer its own default
        ("dflash", False, False, [False, False]),  # ... but writes a config's is_causal: false
        ("dflash", True, None, [True, False]),  # ... and never true
        ("dflash-draft", None, False, [False, False]),  # the fork writes false whatever the config says
        ("dflash-draft", True, False, [False, False]),
    ],
)
@torch.no_grad()
def test_gguf_drafter_causality_is_what_its_converter_writes(tiny_dirs, tmp_path, schema, is_causal, key, causal):
    """A drafter with a sliding layer (window 8 < block 16) and a full one, through either converter: the
    file's causal key decides every layer or (absent) leaves each its default, and it drafts as its
    safetensors source does under that causality."""
    target_dir, drafter_dir, _ = tiny_dirs["qwen3"]
    target = load_target(target_dir, "cpu", torch.float32)
    config = json.loads((drafter_dir / "config.json").read_text())
    if is_causal is not None:
        config["is_causal"] = is_causal
    path = write_drafter_gguf(
        tmp_path / "d.gguf", load_file(str(drafter_dir / "model.safetensors")), config, "F32", schema=schema
    )
    assert _fields(path).get(f"{schema}.attention.causal") is key
    from_gguf = load_drafter(path, target)
    assert [layer.self_attn.causal for layer in from_gguf.layers] == causal
    source = load_drafter(drafter_dir, target, causal=key)
    torch.testing.assert_close(_drafts(from_gguf, target), _drafts(source, target), rtol=0, atol=1e-5)


def test_a_causal_key_that_says_true_makes_every_layer_causal(tiny_dirs, tmp_path):
    """No converter writes it, but a file that does means it."""
    from dflash_chat.engine.models.config import DrafterConfig
    from dflash_chat.engine.weights import gguf as gguf_weights
    from dflash_chat.engine.weights.gguf_file import read_header

    _, drafter_dir, _ = tiny_dirs["qwen3"]
    config = json.loads((drafter_dir / "config.json").read_text())
    path = write_drafter_gguf(
        tmp_path / "d.gguf", load_file(str(drafter_dir / "model.safetensors")), config, "F32", schema="dflash"
    )
    kv = gguf_weights._fields(read_header(path)) | {"dflash.attention.causal": True}
    assert DrafterConfig.from_dict(gguf_weights._drafter_config(kv, "dflash", path)).layer_causal == [True, True]
