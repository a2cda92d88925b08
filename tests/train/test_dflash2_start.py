"""The DFlash2 demo drafter's starting point: the shipped DFlash drafter with DFlash2's modules at identity
drafts exactly as the DFlash drafter (the recipe in train/dflash2.py, step 1)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from dflash_chat.models.demo import demo_paths
from dflash_chat.train.dflash2 import dflash2_config_dict, from_dflash, selector_loss
from dflash_chat.train.drafter import new_drafter
from dflash_chat.train.losses import Blocks


@torch.no_grad()
def test_a_dflash2_drafter_at_identity_drafts_as_its_dflash_source():
    target_dir, drafter_dir = demo_paths("dflash")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    config = json.loads((drafter_dir / "config.json").read_text())
    dflash = new_drafter(config, target, seed=0)
    dflash.load_state_dict({k: v.float() for k, v in load_file(str(drafter_dir / "model.safetensors")).items()})
    drafter = from_dflash(dflash, dflash2_config_dict(config), target, seed=0)
    gen = torch.Generator().manual_seed(0)
    S, B = 40, dflash.block_size
    features = torch.randn(S, dflash.fc.in_features, generator=gen)
    tokens = torch.randint(0, target.config.vocab_size, (S,), generator=gen)
    anchors = torch.tensor([5, 17, 30])
    blocks = torch.full((3, B), dflash.mask_token_id)
    blocks[:, 0] = tokens[anchors]
    embedded = target.get_input_embeddings()(blocks)
    want = dflash.forward_train(features, embedded, anchors)
    got = drafter.forward_train(features, embedded, anchors)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    logits = drafter.logits(got[:, 1:])
    # teacher-forced on the DFlash drafter's own argmax: the selector (zero successor codebook) picks it too
    labels = logits.argmax(dim=-1)
    before = torch.cat((blocks[:, :1], labels[:, :-1]), dim=1)
    top_logits, top_ids = logits.topk(4, dim=-1)
    _, accept = selector_loss(
        drafter, got[:, 1:], logits, Blocks(blocks, labels, before, top_logits, top_ids), torch.ones(B - 1)
    )
    assert accept.tolist() == [float(B)] * 3
