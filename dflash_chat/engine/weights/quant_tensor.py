"""The weight's type while it stays packed: GGML blocks plus their format and logical (float) shape.

Readers (gguf.py, safetensors.py) hand these out; the Quant* modules (engine/quantized.py) hold them on the
device. Plain float formats (F32/F16/BF16) are held as tensors of their own dtype in the same type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_chat.engine import kernels
from dflash_chat.engine.ggml.formats import Format, get_format
from dflash_chat.engine.ggml.quantize import quantize


@dataclass
class QuantTensor:
    """Packed weight rows: data uint8 [*shape[:-1], row_bytes] (float formats: that dtype, shape).

    `input_index`, when set, says the stored columns are the logical ones reordered:
    stored[..., c] = logical[..., input_index[c]]. A column permutation cannot move
    packed blocks (a 256-value block spans two heads), so instead of rewriting the
    bytes, QuantLinear gathers its input the same way: W @ x == stored @ x[input_index].
    """

    data: torch.Tensor
    fmt: Format
    shape: tuple[int, ...]
    input_index: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.shape = tuple(int(s) for s in self.shape)
        want = (*self.shape[:-1], self.fmt.row_bytes(self.shape[-1])) if self.fmt.quantized else self.shape
        if tuple(self.data.shape) != want:
            raise ValueError(f"{self.fmt.name} data of shape {tuple(self.data.shape)} does not hold {self.shape}")

    @classmethod
    def from_float(cls, w: torch.Tensor, fmt: str | Format) -> QuantTensor:
        fmt = get_format(fmt)
        data = quantize(w, fmt) if fmt.quantized else w.to(fmt.float_dtype)
        return cls(data, fmt, tuple(w.shape))

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        """The storage dtype: uint8 for packed blocks (not floating point), else the float dtype."""
        return self.data.dtype

    def to(self, device: torch.device | str | None = None) -> QuantTensor:
        index = None if self.input_index is None else self.input_index.to(device)
        return QuantTensor(self.data.to(device), self.fmt, self.shape, index)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = kernels.dequantize(self.data, self.fmt, dtype).reshape(self.shape)
        if self.input_index is not None:
            w = w[..., torch.argsort(self.input_index.to(w.device))]
        return w

    def __getitem__(self, index) -> QuantTensor:
        """Select along leading dims (never inside a row): whole rows of blocks, nothing dequantized."""
        data = self.data[index]
        lead = data.shape[:-1]
        return QuantTensor(data, self.fmt, (*lead, self.shape[-1]), self.input_index)

    def permute_rows(self, perm: torch.Tensor, dim: int = 0) -> QuantTensor:
        """Reorder rows along a leading dim: whole rows of blocks move, bytes untouched."""
        if dim < 0:
            dim += len(self.shape)
        if dim >= len(self.shape) - 1:
            raise ValueError("permute_rows moves whole rows; it cannot reorder values inside a row")
        return QuantTensor(
            self.data.index_select(dim, perm.to(self.data.device)), self.fmt, self.shape, self.input_index
        )


def as_quant(w: torch.Tensor | QuantTensor) -> QuantTensor:
    if isinstance(w, QuantTensor):
        return w
    fmt = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[w.dtype]
    return QuantTensor(w, get_format(fmt), tuple(w.shape))
