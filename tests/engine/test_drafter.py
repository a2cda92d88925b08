"""The DFlash drafter: both config schemas, per-layer causality, inference vs training forward, multimodal
checkpoint names."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.models.config import DrafterConfig
from tests.engine.tiny import drafter_config, write_drafter


def test_both_config_schemas_read_the_same(tiny_dirs):
    target_cfg = json.loads((tiny_dirs["qwen3_5"][0] / "config.json").read_text())
    new = DrafterConfig.from_dict(drafter_config(target_cfg, schema="new"))
    old = DrafterConfig.from_dict(drafter_config(target_cfg, schema="old"))
    assert new == old
    assert (
        new.block_size == 16 and new.mask_token_id == 5 and new.layer_types == ["sliding_attention", "full_attention"]
    )


@pytest.mark.parametrize(
    "declared, causal, window",
    [
        ({}, [True, False], 8),  # undeclared: the sliding layer causal, the full one bidirectional
        ({"is_causal": True}, [True, True], 8),
        ({"is_causal": False}, [False, False], 8),
        ({"dflash_config": {"causal": True}}, [True, True], 8),
        ({"causal": False}, [False, False], 8),
        ({"use_sliding_window": False}, [True, False], None),  # a sliding layer without its window stays causal
    ],
)
def test_layer_causality_as_the_checkpoint_states_it(tiny_dirs, declared, causal, window):
    cfg = drafter_config(json.loads((tiny_dirs["qwen3_5"][0] / "config.json").read_text()))
    cfg.update({k: v for k, v in declared.items() if k != "dflash_config"})
    cfg["dflash_config"].update(declared.get("dflash_config", {}))
    drafter = DrafterConfig.from_dict(cfg)
    assert drafter.layer_causal == causal and drafter.sliding_window == window


def test_old_schema_drafter_drafts_like_the_new(tiny_dirs, tmp_path):
    target_dir = tiny_dirs["qwen3_5"][0]
    target = load_target(target_dir, "cpu", torch.float32)
    write_drafter(tmp_path / "new", target_dir, seed=4, schema="new")
    write_drafter(tmp_path / "old", target_dir, seed=4, schema="old")
    feats = torch.randn(9, 2 * target.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    outs = []
    for name in ("new", "old"):
        d = load_drafter(tmp_path / name, target)
        d.allocate(64)
        d.append_context(feats, 9)
        outs.append(d.draft_hidden(7, 9))
    torch.testing.assert_close(outs[0], outs[1])


def test_training_forward_equals_inference(tiny_dirs):
    """forward_train (many blocks at once) computes exactly what propose computes one block at a time."""
    target_dir, drafter_dir, _ = tiny_dirs["qwen3_5"]
    target = load_target(target_dir, "cpu", torch.float32)
    for causal in (None, True, False):  # as the checkpoint says (its sliding layer causal), all, none
        drafter = load_drafter(drafter_dir, target, causal=causal)
        gen = torch.Generator().manual_seed(1)
        S = 30  # > sliding window (8): the window matters
        feats = torch.randn(S, 2 * target.cfg.hidden_size, generator=gen)
        tokens = torch.randint(0, target.cfg.vocab_size, (S,), generator=gen)
        anchors = torch.tensor([3, 12, 25])
        block = torch.full((3, 16), drafter.mask_token_id)
        block[:, 0] = tokens[anchors]
        trained = drafter.forward_train(feats, target.model.embed_tokens(block), anchors)
        for a, s in enumerate(anchors.tolist()):
            drafter.allocate(64)
            # context arrives in two installments, as it does during decoding
            drafter.append_context(feats[: s - 2], s - 2)
            drafter.draft_hidden(int(tokens[s - 2]), s - 2)
            drafter.append_context(feats[s - 2 : s], s)
            inferred = drafter.draft_hidden(int(tokens[s]), s)
            torch.testing.assert_close(trained[a, 1:], inferred, atol=1e-5, rtol=1e-5)


def test_multimodal_checkpoint_names_load(tiny_dirs, tmp_path):
    """Qwen3.5/3.6 checkpoints nest text weights under model.language_model. and ship vision + MTP weights."""
    src = tiny_dirs["qwen3_5"][0]
    dst = tmp_path / "mm"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    renamed = {
        ("model.language_model." + k[len("model.") :] if k.startswith("model.") else k): v for k, v in tensors.items()
    }
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 4)
    renamed["mtp.fc.weight"] = torch.zeros(4, 4)
    save_file(renamed, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_5",
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "text_config": cfg,
                "vision_config": {},
            }
        )
    )
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    a = load_target(src, "cpu", torch.float32)
    b = load_target(dst, "cpu", torch.float32)
    torch.testing.assert_close(a(ids, a.new_state(16), logits="all")[0], b(ids, b.new_state(16), logits="all")[0])
