"""The target's MTP layer, loaded from HF safetensors (`mtp.*`) and from GGUF as llama.cpp's converter writes it
(`blk.N.nextn.*`), against a torch reference written from the published rules (tests/engine/mtp_reference.py)."""

import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_chat.engine.load import load_mtp, load_target
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.weights import names
from tests.engine.conftest import MTP_ARCHS
from tests.engine.gguf_write import quantize_like_llama, write_target_gguf
from tests.engine.mtp_reference import ReferenceMTP

PROMPT = [3, 41, 17, 200, 5, 9, 77, 12, 150, 33, 8, 64]
TOL = dict(rtol=0, atol=1e-4)


def _mtp_weights(folder) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if k.startswith("mtp.")}


def _hidden(hf, ids: list[int]) -> torch.Tensor:
    """The target's final-normed hidden states [n, H] (what its LM head reads), by transformers."""
    with torch.no_grad():
        return hf.model(torch.tensor(ids)[None]).last_hidden_state[0]


def _reference(hf, weights, embed=None, head=None) -> ReferenceMTP:
    embed = hf.model.embed_tokens.weight if embed is None else embed
    return ReferenceMTP(hf.config, weights, embed.detach(), (hf.lm_head.weight if head is None else head).detach())


def _teacher_forced(head, hidden: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """Our layer over the rows (h_i, t_{i+1}) at positions 0.. in one eager forward: normed outputs."""
    head.allocate(64)
    return head(hidden[:-1], torch.tensor(ids[1:]), Span.eager(0, len(ids) - 1, torch.device("cpu")))


def _prefilled(target, head, ids: list[int], chunks: int = 1) -> None:
    """The engine's context path: the target's last-layer output over `ids` (in `chunks` prefills) stored."""
    state = target.new_state(64)
    head.allocate(64)
    size = -(-len(ids) // chunks)
    for begin in range(0, len(ids), size):
        piece = torch.tensor(ids[begin : begin + size])
        _, feats = target(piece, state, logits=None, taps=[target.cfg.num_layers - 1])
        head.append_context(feats, piece, begin)


def _drafts(target, head, ids: list[int], last: int, k: int, chunks: int = 1) -> list[int]:
    """Greedy drafts after `ids` + [last]: the context prefilled, then the layer chained from the newest pair."""
    _prefilled(target, head, ids, chunks)
    out = head.propose(torch.tensor([last]), torch.tensor(len(ids)), 64, SamplingParams(), None, None, k)
    return out.tolist()


@pytest.mark.parametrize("arch", MTP_ARCHS)
def test_mtp_layer_from_safetensors_equals_the_reference(arch, mtp_dirs):
    """Teacher-forced rows and chained greedy drafts (the context prefilled whole and in three chunks)."""
    folder, hf = mtp_dirs[arch]
    target = load_target(folder, "cpu", torch.float32)
    head = load_mtp(folder, target)
    assert head is not None
    reference = _reference(hf, _mtp_weights(folder))
    hidden = _hidden(hf, PROMPT)
    want, want_logits = reference(hidden[:-1], torch.tensor(PROMPT[1:]))
    got = _teacher_forced(head, hidden, PROMPT)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(head.logits(got), want_logits, **TOL)

    last = int(hf(torch.tensor(PROMPT)[None]).logits[0, -1].argmax())
    _prefilled(target, head, PROMPT, chunks=2)
    torch.testing.assert_close(head.last[0], hidden[-1], **TOL)  # the target's final-normed state, not its raw one
    newest = head(head.last, torch.tensor([last]), Span.eager(len(PROMPT) - 1, 1, torch.device("cpu")))
    torch.testing.assert_close(newest[0], reference(hidden, torch.tensor(PROMPT[1:] + [last]))[0][-1], **TOL)
    chained = reference.chain(hidden, PROMPT + [last], 4)
    assert _drafts(target, head, PROMPT, last, 4) == chained
    assert _drafts(target, head, PROMPT, last, 4, chunks=3) == chained


def _gguf_mtp_weights(path, arch: str, layers: int) -> dict[str, torch.Tensor]:
    """The MTP layer's tensors as the `gguf` package dequantizes them from the file, under the checkpoints'
    names (the converter's mapping undone: nextn names, layer N, norms stored as 1 + w)."""
    values = {t.name: _values(t) for t in gguf.GGUFReader(str(path)).tensors if t.name.startswith(f"blk.{layers}.")}
    nextn = {
        "eh_proj": "fc",
        "enorm": "pre_fc_norm_embedding",
        "hnorm": "pre_fc_norm_hidden",
        "shared_head_norm": "norm",
    }
    _, layer = names.target_rules("qwen35moe" if arch.endswith("moe") else "qwen35")
    hf_of = {f"blk.{layers}.nextn.{g}.weight": f"mtp.{h}.weight" for g, h in nextn.items()}
    hf_of.update({r.gguf_name(layers): "mtp.layers.0." + r.hf.removeprefix("model.layers.{bid}.") for r in layer})
    out = {hf: values[g] - float(g.endswith("norm.weight")) for g, hf in hf_of.items() if g in values}
    gate, up = (values.get(f"blk.{layers}.ffn_{part}_exps.weight") for part in ("gate", "up"))
    if gate is not None and up is not None:
        out["mtp.layers.0.mlp.experts.gate_up_proj"] = torch.cat((gate, up), dim=1)
    return out


def _values(t) -> torch.Tensor:
    values = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    return torch.from_numpy(values.reshape([int(d) for d in reversed(t.shape.tolist())]))


def _dequantized(path, name: str) -> torch.Tensor:
    return _values(next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name))


@pytest.mark.slow(seconds=6)
@pytest.mark.parametrize("arch", MTP_ARCHS)
@pytest.mark.parametrize("mix", ["F32", "Q8_0", "Q4_K_M"])
def test_mtp_layer_from_a_converted_gguf_equals_the_reference(arch, mix, mtp_dirs, tmp_path):
    """The target converted as llama.cpp's converter writes it (then quantized as llama-quantize does): our
    layer equals the reference on the file's own weights (the `gguf` package's dequantization), embedding
    and head included; F32 on the checkpoint's weights."""
    folder, hf = mtp_dirs[arch]
    config = json.loads((folder / "config.json").read_text())
    state = {**hf.state_dict(), **_mtp_weights(folder)}
    path = write_target_gguf(tmp_path / "t-f32.gguf", state, config, "F32")
    if mix != "F32":
        path = quantize_like_llama(path, tmp_path / f"t-{mix}.gguf", mix)
    target = load_target(path, "cpu", torch.float32)
    head = load_mtp(path, target)
    assert head is not None
    layers = config["num_hidden_layers"]
    if mix == "F32":
        reference = _reference(hf, _mtp_weights(folder))
    else:
        weights, shipped = _gguf_mtp_weights(path, arch, layers), _mtp_weights(folder)
        assert set(weights) == set(shipped)
        weights = {k: v.reshape(shipped[k].shape) for k, v in weights.items()}  # llama-quantize drops [H, 1]'s 1
        reference = _reference(
            hf, weights, _dequantized(path, "token_embd.weight"), _dequantized(path, "output.weight")
        )
    hidden = _hidden(hf, PROMPT)
    want, want_logits = reference(hidden[:-1], torch.tensor(PROMPT[1:]))
    got = _teacher_forced(head, hidden, PROMPT)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(head.logits(got), want_logits, **TOL)


def test_a_checkpoint_without_mtp_weights_has_no_mtp_layer(mtp_dirs, tiny_dirs, tmp_path):
    """No MTP layer: a target without one, a GGUF whose extra blocks carry no nextn tensors, and a folder
    whose config declares one but whose weights were stripped of it."""
    plain = tiny_dirs["qwen3_5"][0]
    assert load_mtp(plain, load_target(plain, "cpu", torch.float32)) is None

    folder, hf = mtp_dirs["qwen3_5"]
    config = json.loads((folder / "config.json").read_text())
    config.pop("mtp_num_hidden_layers")
    stand_in = write_target_gguf(tmp_path / "stand-in.gguf", hf.state_dict(), config, "F32", extra_mtp_layers=1)
    assert load_mtp(stand_in, load_target(stand_in, "cpu", torch.float32)) is None

    stripped = tmp_path / "stripped"
    stripped.mkdir()
    for f in folder.iterdir():
        (stripped / f.name).write_bytes(f.read_bytes())
    kept = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if not k.startswith("mtp.")}
    save_file(kept, str(stripped / "model.safetensors"))
    target = load_target(stripped, "cpu", torch.float32)
    assert target.cfg.mtp_layers == 1 and load_mtp(stripped, target) is None
