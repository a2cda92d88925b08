"""Our drafter against z-lab's drafter code (tests/engine/vendor, MIT) on the same weights and features.

The vendored model (z-lab/dflash 44947fb) gives the projections, norms, RoPE incl. YaRN, the context
cache and cropping as published; it ran every layer with `is_causal=False`. The block attention here is
z-lab's current rule (07ebd93 `dflash/model.py`), as released drafters were trained: each layer's
`is_causal` as `Qwen3DFlashAttention.__init__` sets it (what the config states for every layer, else
`layer_type == "sliding_attention"`), and `_zlab_attention` is `_attention_mask` with a plain masked
softmax: queries bottom-right aligned to the keys [cache ; context ; block], causal `key <= query`, a
window `query - key < w` and, when not causal, also `key - query < w`.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AttentionInterface, DynamicCache, Qwen3Config

from dflash_chat.engine.load import load_drafter, load_target
from tests.engine.tiny import write_drafter, write_target
from tests.engine.vendor.zlab_dflash_model import DFlashDraftModel, extract_context_feature

WINDOW = 6  # smaller than the block: the window's forward half matters too
BLOCK = 8
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}


def _zlab_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None, **kwargs
):
    """z-lab 07ebd93's masked attention for [b, h, q, d] queries over [b, kv_h, k, d] keys and values."""
    q_pos = key.shape[2] - query.shape[2] + torch.arange(query.shape[2])[:, None]
    k_pos = torch.arange(key.shape[2])[None, :]
    visible = torch.ones(q_pos.shape[0], k_pos.shape[1], dtype=torch.bool)
    if module.is_causal:
        visible &= k_pos <= q_pos
    if sliding_window is not None:
        visible &= q_pos - k_pos < sliding_window
        if not module.is_causal:
            visible &= k_pos - q_pos < sliding_window
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    scores = (query @ key.transpose(-1, -2) * scaling).masked_fill(~visible, float("-inf"))
    return (scores.softmax(dim=-1) @ value).transpose(1, 2).contiguous(), None


AttentionInterface.register("zlab_07ebd93_reference", _zlab_attention)


def _declared(cfg: dict) -> bool | None:
    """Causality the config states for every layer: top-level `is_causal` or `dflash_config.causal`."""
    for value in (cfg.get("is_causal"), cfg["dflash_config"].get("causal")):
        if value is not None:
            return bool(value)
    return None


def _layer_causal(cfg: dict) -> list[bool]:
    declared = _declared(cfg)
    return [t == "sliding_attention" if declared is None else declared for t in cfg["layer_types"]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    write_target(root / "target", "qwen3", seed=41)
    return root, load_target(root / "target", "cpu", torch.float32)


def _pair(root, target, name: str, dflash_config: dict | None = None, **config_changes):
    """Our drafter and z-lab's, from one z-lab style folder (config.json + safetensors)."""
    folder = root / name
    cfg = write_drafter(
        folder,
        root / "target",
        seed=42,
        layers=3,
        block_size=BLOCK,
        sliding_window=WINDOW,
        schema="old",
        layer_types=LAYER_TYPES,
    )
    cfg.update(config_changes)
    cfg["dflash_config"].update(dflash_config or {})
    (folder / "config.json").write_text(json.dumps(cfg))
    ours = load_drafter(folder, target)
    config = Qwen3Config(**cfg)
    config._attn_implementation = "zlab_07ebd93_reference"
    ref = DFlashDraftModel(config).eval()
    missing, unexpected = ref.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    assert not unexpected and all(k.startswith("rotary_emb") for k in missing)
    for layer, causal in zip(ref.layers, _layer_causal(cfg), strict=True):
        layer.self_attn.is_causal = causal
    return ours, ref, cfg


def _reference_hidden(ref, target, features, tokens, steps):
    """z-lab's draft loop (dflash_generate's drafter half): per step, the drafted positions' hidden states."""
    cache = DynamicCache()
    out = []
    for start, end in steps:  # context rows start..end-1 become known; the block starts at end
        block = torch.full((1, BLOCK), ref.mask_token_id)
        block[0, 0] = tokens[end]
        positions = torch.arange(cache.get_seq_length(), end + BLOCK)[None]
        hidden = ref(
            target_hidden=features[None, start:end],
            noise_embedding=target.model.embed_tokens(block),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        out.append(hidden[0, 1 - BLOCK :])
        cache.crop(end - cache.get_seq_length())  # z-lab's crop(start); transformers 5 takes it as a negative count
    return out


def _our_hidden(ours, features, tokens, steps):
    ours.allocate(64)
    out = []
    for start, end in steps:
        ours.append_context(features[start:end], end)
        out.append(ours.draft_hidden(int(tokens[end]), end))
    return out


def _our_logits(ours, features, tokens, steps):
    return [ours.logits(h) for h in _our_hidden(ours, features, tokens, steps)]


def _inputs(model, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, 2 * model.cfg.hidden_size, generator=gen),
        torch.randint(0, model.cfg.vocab_size, (n,), generator=gen),
    )


STEPS = [(0, 13), (13, 14), (14, 21)]  # a prompt, one accepted token, several: contexts past the window


@pytest.mark.parametrize(
    "case, changes",
    [
        ("undeclared", {}),  # sliding layers causal, the full layer bidirectional
        ("is-causal", {"is_causal": True}),
        ("not-causal", {"is_causal": False}),
        ("dflash-config-causal", {"dflash_config": {"causal": True}}),
        ("dflash-config-not-causal", {"dflash_config": {"causal": False}}),
        ("yarn", {"rope_scaling": YARN, "max_position_embeddings": 256}),
    ],
)
@torch.no_grad()
def test_drafts_match_zlab_reference(target, case, changes):
    root, model = target
    ours, ref, cfg = _pair(root, model, case, **changes)
    assert [layer.self_attn.causal for layer in ours.layers] == _layer_causal(cfg)
    features, tokens = _inputs(model, 40, seed=3)
    want = _reference_hidden(ref, model, features, tokens, STEPS)
    got = _our_hidden(ours, features, tokens, STEPS)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours.logits(g), model.lm_head(w), rtol=0, atol=1e-5)


@torch.no_grad()
def test_each_causality_drafts_differently(target):
    """The cases above would not tell the settings apart if the window or the causality never mattered."""
    root, model = target
    ours, _, _ = _pair(root, model, "settings")
    assert [layer.self_attn.causal for layer in ours.layers] == [True, False, True]
    features, tokens = _inputs(model, 40, seed=3)
    drafts = [
        torch.cat(_our_hidden(load_drafter(root / "settings", model, causal=causal), features, tokens, STEPS))
        for causal in (None, True, False)
    ]
    for i in range(3):
        for j in range(i):
            assert (drafts[i] - drafts[j]).abs().max() > 1e-2


@torch.no_grad()
def test_a_tap_of_the_last_target_layer_reads_the_final_normed_state(target, tmp_path):
    """z-lab taps hidden_states[i + 1]; for the target's last layer transformers puts the normed state there."""
    from transformers import AutoModelForCausalLM

    root, model = target
    last = model.cfg.num_layers - 1
    folder = tmp_path / "last-tap"
    write_drafter(folder, root / "target", seed=5, taps=[1, last])
    drafter = load_drafter(folder, model)
    hf = AutoModelForCausalLM.from_pretrained(str(root / "target")).float().eval()
    ids = torch.tensor([3, 14, 15, 92, 65, 35])
    hidden_states = hf(ids[None], output_hidden_states=True).hidden_states
    want = drafter.hidden_norm(drafter.fc(extract_context_feature(hidden_states, [1, last])[0]))
    _, features = model(ids, model.new_state(16), logits=None, taps=drafter.target_layer_ids)
    torch.testing.assert_close(drafter.project_context(features), want, rtol=0, atol=1e-4)


@torch.no_grad()
def test_yarn_drafter_gguf_drafts_like_its_folder(target, tmp_path):
    from tests.engine.gguf_write import write_drafter_gguf

    root, model = target
    ours, _, _ = _pair(root, model, "yarn-gguf", rope_scaling=YARN, max_position_embeddings=256)
    folder = root / "yarn-gguf"
    cfg = json.loads((folder / "config.json").read_text())
    path = write_drafter_gguf(
        tmp_path / "yarn.gguf", load_file(str(folder / "model.safetensors")), cfg, "F32", schema="dflash"
    )  # mainline's converter keeps an undeclared causality undeclared
    from_gguf = load_drafter(path, model)
    assert from_gguf.cfg.rope_scaling == ours.cfg.rope_scaling
    gen = torch.Generator().manual_seed(4)
    features = torch.randn(30, 2 * model.cfg.hidden_size, generator=gen)
    tokens = torch.randint(0, model.cfg.vocab_size, (30,), generator=gen)
    steps = [(0, 9), (9, 17)]
    for a, b in zip(
        _our_logits(ours, features, tokens, steps), _our_logits(from_gguf, features, tokens, steps), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
