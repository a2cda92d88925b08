"""A Triton kernel that fails or disagrees on first use is replaced by the torch path, with a warning."""

import pytest
import torch

pytest.importorskip("triton")

from dflash_chat.engine import kernels  # noqa: E402
from dflash_chat.engine.ggml.formats import get_format  # noqa: E402
from dflash_chat.engine.ggml.quantize import quantize  # noqa: E402
from dflash_chat.engine.kernels import first_use, reference, switches  # noqa: E402


@pytest.fixture
def interpreter(monkeypatch):
    """The Triton paths on CPU tensors (TRITON_INTERPRET=1) and no kernel checked yet; the switches as they were
    afterwards."""
    with monkeypatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        patch.setattr(first_use, "checked", {})
        switches.reload()
        yield
    switches.reload()


@pytest.fixture
def q8_weight():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))  # K = 256: a shape the kernels take
    return quantize(w, "Q8_0"), get_format("Q8_0")


@pytest.mark.parametrize("failure", ["raises", "wrong"])
def test_broken_kernel_falls_back_to_torch(monkeypatch, interpreter, q8_weight, failure):
    from dflash_chat.engine.kernels import triton_quant

    packed, fmt = q8_weight

    calls = []

    def broken(x, p, f, n):
        calls.append(x.shape)
        if failure == "raises":
            raise RuntimeError("no kernel image is available")
        return torch.zeros(x.shape[0], n, dtype=x.dtype)

    monkeypatch.setattr(triton_quant, "matmul", broken)
    x = torch.randn(3, 256)
    with pytest.warns(UserWarning, match="Triton matmul Q8_0 kernel disabled"):
        y = kernels.matmul(x, packed, fmt, 64)
    torch.testing.assert_close(y, reference.matmul(x, packed, fmt, 64))
    assert calls  # the kernel was really tried
    # decided once per format and device
    assert first_use.checked[("matmul", fmt.name, packed.device, x.dtype)] is False


def test_broken_experts_kernel_falls_back_to_torch(monkeypatch, interpreter, q8_weight):
    from dflash_chat.engine.kernels import triton_quant

    packed, fmt = q8_weight
    experts = torch.stack([packed, packed.flip(0)])  # two experts of 64 x 256

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(triton_quant, "moe_matmul", broken)
    x = torch.randn(3, 256)
    r = kernels.Routes(*reference.route(torch.tensor([[1, 0], [0, 1], [1, 0]]), 2))
    with pytest.warns(UserWarning, match="Triton experts Q8_0 kernel disabled"):
        y = kernels.moe_matmul(x, experts, fmt, 64, kernels.Pairs(r.token_of, r.order, r.offsets))
    want = torch.stack(
        [
            x[t] @ reference.dequantize_rows(experts[e], fmt, torch.float32).T
            for t, e in [(0, 1), (0, 0), (1, 0), (1, 1), (2, 1), (2, 0)]
        ]
    )
    torch.testing.assert_close(y, want)


def test_broken_dequantize_kernel_falls_back_to_torch(monkeypatch, interpreter, q8_weight):
    """The embedding lookup dequantizes gathered rows every step: a wrong kernel there must not go unnoticed."""
    from dflash_chat.engine.kernels import triton_quant
    from dflash_chat.engine.quantized import QuantEmbedding
    from dflash_chat.engine.weights.quant_tensor import QuantTensor

    packed, fmt = q8_weight
    monkeypatch.setattr(triton_quant, "dequantize", lambda p, f, k, dtype: torch.zeros(p.shape[0], k, dtype=dtype))
    emb = QuantEmbedding(QuantTensor(packed, fmt, (64, 256)))
    ids = torch.tensor([3, 9])
    with pytest.warns(UserWarning, match="Triton dequantize Q8_0 kernel disabled"):
        rows = emb(ids)
    torch.testing.assert_close(rows, reference.dequantize_rows(packed, fmt, torch.float32)[ids])
