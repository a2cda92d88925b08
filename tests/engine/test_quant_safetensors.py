"""Safetensors reading: single file, sharded with index, quantize-on-load, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.weights.quant_tensor import QuantTensor
from dflash_chat.engine.weights.safetensors import read_safetensors
from tests.engine.quant_helpers import one_thread

_single_thread = pytest.fixture(autouse=True)(one_thread)


def _state():
    g = torch.Generator().manual_seed(0)
    return {
        "fc.weight": torch.randn(256, 512, generator=g).to(torch.bfloat16),
        "layers.0.mlp.down_proj.weight": torch.randn(256, 96, generator=g).to(torch.bfloat16),
        "norm.weight": torch.randn(256, generator=g).to(torch.bfloat16),
    }


def test_single_file_reads_every_tensor_exactly(tmp_path):
    sd = _state()
    save_file(sd, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 256}))
    m = read_safetensors(tmp_path)
    assert set(m.tensors) == set(sd) and m.hf_config == {"hidden_size": 256}
    for k, v in sd.items():
        assert torch.equal(m.tensors[k], v)


def test_sharded_with_index(tmp_path):
    sd = _state()
    names = sorted(sd)
    save_file({names[0]: sd[names[0]]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({n: sd[n] for n in names[1:]}, tmp_path / "model-00002-of-00002.safetensors")
    weight_map = {
        names[0]: "model-00001-of-00002.safetensors",
        **{n: "model-00002-of-00002.safetensors" for n in names[1:]},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    m = read_safetensors(tmp_path)
    assert len(m.files) == 2
    for k, v in sd.items():
        assert torch.equal(m.tensors[k], v)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_quantize_on_load(tmp_path, quant):
    sd = _state()
    save_file(sd, tmp_path / "model.safetensors")
    m = read_safetensors(tmp_path / "model.safetensors", quantize=quant)
    fc = m.tensors["fc.weight"]
    assert isinstance(fc, QuantTensor) and fc.fmt.name == quant
    assert torch.equal(fc.data, QuantTensor.from_float(sd["fc.weight"].float(), quant).data)
    down = m.tensors["layers.0.mlp.down_proj.weight"]  # 96 columns: not whole Q4_K blocks -> Q8_0
    assert isinstance(down, QuantTensor) and down.fmt.name == "Q8_0"
    assert torch.equal(m.tensors["norm.weight"], sd["norm.weight"])  # norms stay float


def test_errors(tmp_path):
    with pytest.raises(ModelFormatError, match="no .safetensors weight files"):
        read_safetensors(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ModelFormatError, match="not a readable safetensors file"):
        read_safetensors(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(ModelFormatError, match="gone.safetensors"):
        read_safetensors(tmp_path)
    with pytest.raises(ModelFormatError, match="cannot quantize on load"):
        read_safetensors(tmp_path, quantize="Q2_K")
