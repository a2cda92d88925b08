"""GGUF targets through the engine's own TargetModel: F32 logits equal the HF model's; with the
Q4_K_M mix, the model holding QuantLinear/QuantEmbedding/QuantExperts gives the logits of the same model
holding the dequantized weights as floats."""

from __future__ import annotations

import pytest
import torch

from dflash_chat.engine.checkpoint import materialise
from dflash_chat.engine.models.config import TargetConfig
from dflash_chat.engine.models.layers import Rotary
from dflash_chat.engine.models.target import TargetModel
from dflash_chat.engine.quantized import QuantExperts, QuantLinear
from dflash_chat.engine.weights.gguf import read_gguf
from dflash_chat.engine.weights.quant_tensor import QuantTensor
from tests.engine.quant_helpers import one_thread
from tests.engine.test_quant_gguf import MODELS, _write

_single_thread = pytest.fixture(autouse=True)(one_thread)
IDS = torch.tensor([1, 5, 9, 200, 17, 3, 42, 7])


def _float(t):
    if isinstance(t, tuple):
        return torch.cat([_float(p) for p in t], dim=1)
    return t.dequantize() if isinstance(t, QuantTensor) else t.float()


def _engine_model(m, quantized: bool) -> TargetModel:
    """The loader's own materialise: packed tensors become Quant* modules; floats (dequantized) fill nn modules."""
    cfg = TargetConfig.from_dict(m.hf_config)
    with torch.device("meta"):
        model = TargetModel(cfg)
    tensors = dict(m.tensors.items())
    if not quantized:
        tensors = {k: _float(v) for k, v in tensors.items()}
    materialise(model, tensors, torch.device("cpu"), torch.float32, "target")
    model.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta)
    return model.eval()


def _logits(model: TargetModel) -> torch.Tensor:
    logits, _ = model(IDS, model.new_state(32), logits="all")
    return logits


@pytest.mark.parametrize("arch", list(MODELS))
def test_f32_gguf_logits_equal_hf(tmp_path, arch):
    hf = MODELS[arch]()
    m = read_gguf(_write(tmp_path, hf, "F32"))
    with torch.no_grad():
        want = hf(IDS[None]).logits[0]
    torch.testing.assert_close(_logits(_engine_model(m, quantized=False)), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", list(MODELS))
def test_quant_modules_are_drop_ins_in_the_engine_model(tmp_path, arch):
    hf = MODELS[arch]()
    m = read_gguf(_write(tmp_path, hf, "Q4_K_M"))
    quant = _engine_model(m, quantized=True)
    assert any(isinstance(mod, QuantLinear) for mod in quant.modules())
    if arch == "qwen35moe":
        assert any(isinstance(mod, QuantExperts) for mod in quant.modules())
    torch.testing.assert_close(_logits(quant), _logits(_engine_model(m, quantized=False)), rtol=0, atol=1e-4)
