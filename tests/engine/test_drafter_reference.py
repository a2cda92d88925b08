"""Our drafter against z-lab's own drafter code (tests/engine/vendor, MIT) on the same weights and features.

z-lab runs its drafter through transformers' attention functions with `is_causal=False` and each layer's
`sliding_window`; on a GPU that is flash-attention, whose window is symmetric (`window_size=(w-1, w-1)`,
bottom-right aligned, applied only when there are more keys than the window). transformers' CPU
functions (sdpa, eager) ignore `sliding_window`, so the reference runs here through `_flash_window`, which
computes exactly what flash-attention computes, as a plain masked softmax. Everything else (projections,
norms, RoPE incl. YaRN, the context cache, cropping) is z-lab's code as published.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AttentionInterface, DynamicCache, Qwen3Config

from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.tiny import write_drafter, write_target
from tests.engine.vendor.zlab_dflash_model import DFlashDraftModel, extract_context_feature

WINDOW = 6  # smaller than the block: the window's forward half matters too
BLOCK = 8
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}


def _flash_window(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                  is_causal=None, **kwargs):
    """flash_attn_func(q, k, v, causal, window_size=(w-1, w-1)) as transformers calls it, for [b, h, q, d]."""
    q_len, k_len = query.shape[2], key.shape[2]
    causal = module.is_causal if is_causal is None else is_causal
    q_pos = torch.arange(q_len)[:, None] + (k_len - q_len)  # flash aligns queries to the last keys
    rel = q_pos - torch.arange(k_len)[None, :]
    visible = rel >= 0 if causal else torch.ones_like(rel, dtype=torch.bool)
    if sliding_window is not None and k_len > sliding_window:
        visible &= rel.abs() <= sliding_window - 1
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=visible, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("zlab_window_reference", _flash_window)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    write_target(root / "target", "qwen3", seed=41)
    return root, load_target(root / "target", "cpu", torch.float32)


def _pair(root, target, name: str, **config_changes):
    """Our drafter and z-lab's, from one z-lab style folder (config.json + safetensors)."""
    folder = root / name
    cfg = write_drafter(folder, root / "target", seed=42, layers=3, block_size=BLOCK, sliding_window=WINDOW, schema="old",
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    cfg.update(config_changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    ours = load_drafter(folder, target)
    config = Qwen3Config(**cfg)
    config._attn_implementation = "zlab_window_reference"
    ref = DFlashDraftModel(config).eval()
    missing, unexpected = ref.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    assert not unexpected and all(k.startswith("rotary_emb") for k in missing)
    return ours, ref


def _reference_logits(ref, target, features, tokens, steps, causal):
    """z-lab's draft loop (dflash_generate's drafter half): per step, the block's draft logits [B-1, V]."""
    cache = DynamicCache()
    out = []
    for start, end in steps:  # context rows start..end-1 become known; the block starts at end
        block = torch.full((1, BLOCK), ref.mask_token_id)
        block[0, 0] = tokens[end]
        positions = torch.arange(cache.get_seq_length(), end + BLOCK)[None]
        hidden = ref(target_hidden=features[None, start:end], noise_embedding=target.model.embed_tokens(block),
                     position_ids=positions, past_key_values=cache, use_cache=True, is_causal=causal)
        out.append(target.lm_head(hidden[0, 1 - BLOCK:]))
        cache.crop(end - cache.get_seq_length())  # z-lab's crop(start); transformers 5 takes it as a negative count
    return out


def _our_logits(ours, features, tokens, steps):
    ours.allocate(64)
    out = []
    for start, end in steps:
        ours.append_context(features[start:end], end)
        out.append(ours.logits(ours.draft_hidden(int(tokens[end]), end)))
    return out


@pytest.mark.parametrize("case, changes", [
    ("bidirectional", {}),
    ("causal-checkpoint", {"is_causal": True}),
    ("yarn", {"rope_scaling": YARN, "max_position_embeddings": 256}),
])
@torch.no_grad()
def test_draft_logits_match_zlab_reference(target, case, changes):
    root, model = target
    ours, ref = _pair(root, model, case, **changes)
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(40, 2 * model.cfg.hidden_size, generator=gen)
    tokens = torch.randint(0, model.cfg.vocab_size, (40,), generator=gen)
    steps = [(0, 13), (13, 14), (14, 21)]  # a prompt, one accepted token, several: contexts past the window
    causal = bool(changes.get("is_causal", False))
    want = _reference_logits(ref, model, features, tokens, steps, causal=causal)
    got = _our_logits(ours, features, tokens, steps)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-4)
    assert ours.cfg.causal == causal


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
    from dflash_chat.engine.weights.gguf_write import write_drafter_gguf

    root, model = target
    ours, _ = _pair(root, model, "yarn-gguf", rope_scaling=YARN, max_position_embeddings=256)
    folder = root / "yarn-gguf"
    cfg = json.loads((folder / "config.json").read_text())
    path = write_drafter_gguf(tmp_path / "yarn.gguf", load_file(str(folder / "model.safetensors")), cfg, "F32")
    from_gguf = load_drafter(path, model)
    assert from_gguf.cfg.rope_scaling == ours.cfg.rope_scaling
    gen = torch.Generator().manual_seed(4)
    features = torch.randn(30, 2 * model.cfg.hidden_size, generator=gen)
    tokens = torch.randint(0, model.cfg.vocab_size, (30,), generator=gen)
    steps = [(0, 9), (9, 17)]
    for a, b in zip(_our_logits(ours, features, tokens, steps), _our_logits(from_gguf, features, tokens, steps)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
