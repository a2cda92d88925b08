"""The shipped demo target's own MTP layer (trained by `python -m dflash_chat.train demo --stages prepare,mtp,ship`):
inside its safetensors under the Qwen checkpoints' names, loaded as the engine's `mtp` method, lossless and
really trained, and kept as `nextn` tensors when the target is converted to GGUF as llama.cpp's converter
writes it."""

from __future__ import annotations

import json

import gguf
import pytest
import torch
from safetensors.torch import load_file

from dflash_chat.engine.load import load_mtp, load_pair, load_target
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.models.demo import demo_dir, demo_heldout_prompts
from tests.engine.gguf_write import write_target_gguf
from tests.engine.test_mtp import TOL, _hidden, _mtp_weights, _reference, _teacher_forced

# Floor for the MTP layer's mean acceptance length chained 2 deep on held-out prompts: an untrained layer
# drafts garbage and stays near 1 (the shipped one measured 2.7-2.9 on these prompts).
MTP_TAU_FLOOR = 2.0
NEXTN = ("eh_proj", "enorm", "hnorm", "shared_head_norm")


def _target():
    return demo_dir() / "target"


def _first_prompts(tokenizer, n: int) -> list[list[int]]:
    from dflash_chat.runtime.prompt import build_prompt

    return [build_prompt(tokenizer, chat, thinking=False).ids for chat in demo_heldout_prompts()[:n]]


def test_the_demo_target_ships_its_mtp_layer_under_the_checkpoints_names():
    config = json.loads((_target() / "config.json").read_text())
    assert config["mtp_num_hidden_layers"] == 1
    weights = _mtp_weights(_target())
    for own in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert f"mtp.{own}.weight" in weights
    assert "mtp.layers.0.self_attn.q_proj.weight" in weights and "mtp.layers.0.mlp.down_proj.weight" in weights
    hidden = config["hidden_size"]
    assert weights["mtp.fc.weight"].shape == (hidden, 2 * hidden)
    assert all(t.dtype == torch.bfloat16 for t in weights.values())  # as the rest of the target
    # no embedding or head of its own: it borrows the target's
    assert not any(name.startswith(("mtp.embed_tokens", "mtp.lm_head", "mtp.shared_head")) for name in weights)


def test_the_demo_loads_with_an_mtp_method_that_drafts_losslessly_and_lands():
    pair = load_pair(_target(), None, device="cpu", dtype=torch.float32, draft="off", speculate="none")
    assert pair.engine.mtp is not None and "mtp" in pair.engine.most
    plain = pair.engine
    mtp = type(plain)(
        plain.target,
        None,
        mtp=load_mtp(_target(), plain.target),
        max_context=plain.max_context,
        draft=2,
        speculate="mtp",
        end_ids=plain.end_ids,
    )
    params = SamplingParams(temperature=0, max_new_tokens=48)
    steps = tokens = 0
    for ids in _first_prompts(pair.tokenizer, 2):
        plain.reset()
        want = [t for e in plain.generate(ids, params) if hasattr(e, "token_ids") for t in e.token_ids]
        mtp.reset()
        got, stats = [], None
        for event in mtp.generate(ids, params):
            got += getattr(event, "token_ids", [])
            stats = getattr(event, "stats", stats)
        assert got == want
        assert stats is not None and set(stats.methods) <= {"mtp", "plain"} and stats.methods["mtp"].steps
        steps, tokens = steps + stats.steps, tokens + stats.new_tokens - 1
    assert tokens / steps >= MTP_TAU_FLOOR


@pytest.mark.slow(seconds=8)
def test_the_demo_target_converted_to_gguf_keeps_its_mtp_layer_as_nextn_tensors(tmp_path):
    """Written as llama.cpp's converter writes a Qwen3.5 target with an MTP layer (then Q8_0 as llama-quantize
    does): block N holds `nextn.*` and the layer's decoder tensors, `qwen35.nextn_predict_layers` is 1, no `mtp.*`
    name survives; the engine loads it as an `mtp` method whose F32 layer equals the reference written from
    vLLM's rules on the shipped weights, and whose Q8_0 layer drafts losslessly."""
    from transformers import AutoModelForCausalLM

    from tests.engine.gguf_write import quantize_like_llama

    config = json.loads((_target() / "config.json").read_text())
    state = {k: v.float() for k, v in load_file(str(_target() / "model.safetensors")).items()}
    path = write_target_gguf(tmp_path / "demo-f32.gguf", state, config, "F32")
    reader = gguf.GGUFReader(str(path))
    layers = config["num_hidden_layers"]
    found = {t.name for t in reader.tensors}
    assert {f"blk.{layers}.nextn.{n}.weight" for n in NEXTN} <= found
    assert f"blk.{layers}.attn_q.weight" in found and f"blk.{layers}.ffn_down.weight" in found
    assert not any(name.startswith("mtp.") for name in found)
    assert int(reader.fields["qwen35.nextn_predict_layers"].parts[-1][0]) == 1

    target = load_target(path, "cpu", torch.float32)
    head = load_mtp(path, target)
    assert head is not None
    hf = AutoModelForCausalLM.from_pretrained(_target(), dtype=torch.float32).eval()
    prompt = _first_prompts(_tokenizer(), 1)[0][:24]
    hidden = _hidden(hf, prompt)
    want, want_logits = _reference(hf, {k: v.float() for k, v in _mtp_weights(_target()).items()})(
        hidden[:-1], torch.tensor(prompt[1:])
    )
    got = _teacher_forced(head, hidden, prompt)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(head.logits(got), want_logits, **TOL)

    q8 = quantize_like_llama(path, tmp_path / "demo-q8_0.gguf", "Q8_0")
    pair = load_pair(q8, None, tokenizer=_target(), device="cpu", dtype=torch.float32, speculate="mtp", draft=2)
    assert pair.engine.mtp is not None
    plain = load_pair(q8, None, tokenizer=_target(), device="cpu", dtype=torch.float32, speculate="none")
    params = SamplingParams(temperature=0, max_new_tokens=32)
    ids = _first_prompts(pair.tokenizer, 1)[0]
    outputs = []
    for engine in (plain.engine, pair.engine):
        outputs.append([t for e in engine.generate(ids, params) if hasattr(e, "token_ids") for t in e.token_ids])
    assert outputs[0] == outputs[1] and len(outputs[0]) > 4


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_target())


def test_a_branching_prompt_resumes_the_mtp_layer_from_its_checkpoint():
    """Prefix reuse with the MTP layer: a prompt that shares only the start of the last one resumes from a
    checkpoint (the GDN state and the MTP layer's newest hidden state there): its MTP-drafted answer is a fresh
    engine's, token for token and draft for draft, and it reuses part of the prompt."""
    from dflash_chat.engine.spec import Engine

    pair = load_pair(_target(), None, device="cpu", dtype=torch.float32, speculate="none")
    target = pair.engine.target

    def engine() -> Engine:
        return Engine(
            target,
            None,
            mtp=load_mtp(_target(), target),
            max_context=512,
            draft=2,
            speculate="mtp",
            end_ids=pair.engine.end_ids,
        )

    first, second = _first_prompts(pair.tokenizer, 2)
    shared = first[: len(first) // 2]
    branch = shared + second[len(second) // 2 :]
    params = SamplingParams(temperature=0, max_new_tokens=24)
    reusing = engine()
    reusing.checkpoint_every = 8
    list(reusing.generate(first, params))
    events = list(reusing.generate(branch, params))
    got = [t for e in events for t in getattr(e, "token_ids", [])]
    reused = next(e for e in events if hasattr(e, "reused_tokens")).reused_tokens
    fresh = [t for e in engine().generate(branch, params) for t in getattr(e, "token_ids", [])]
    assert 0 < reused <= len(shared) and got == fresh
    # drafts landed, and the layer holds what a fresh prefill of the branch gives it, to float rounding (a resumed
    # prefill runs other matmul shapes, so a near-tie draft may flip between CPUs): the pairs stored for every
    # position and the newest hidden state (it resumed from the checkpoint's, not the last answer's)
    assert sum(e.accepted for e in events if hasattr(e, "accepted")) > 0
    one = SamplingParams(temperature=0, max_new_tokens=1)
    resumed, again = engine(), engine()
    resumed.checkpoint_every = 8
    list(resumed.generate(first, params))
    list(resumed.generate(branch, one))
    list(again.generate(branch, one))
    n = len(branch) - 1
    for a, b in ((resumed.mtp.cache.k, again.mtp.cache.k), (resumed.mtp.cache.v, again.mtp.cache.v)):
        torch.testing.assert_close(a[:n], b[:n], rtol=0, atol=1e-5)
    torch.testing.assert_close(resumed.mtp.last, again.mtp.last, rtol=0, atol=1e-5)
