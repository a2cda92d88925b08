"""A GGUF file's header (metadata and tensor table), read fast and checked, over a read-only memory map.

gguf's GGUFReader builds every metadata value into numpy pieces, 250k-token vocabularies included: about
14 s per Qwen3.6 file on a slow core, on every load. This reader skips the string arrays nobody asked
to decode (the vocabulary, the merges) and reads numeric arrays in one go. It checks each tensor record
as ggml would and names the tensor in a one-line error: zero or negative dims, a row that is not whole
blocks of its type, data past the end of the file. Tensors are `Tensor` records whose `data` is a view
of the file, shaped as GGUFReader shapes it (floats as their dtype, blocks as bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from dflash_chat.engine.errors import ModelFormatError

MAX_DIMS = 4  # GGML_MAX_DIMS
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_FLOAT_DTYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}


@dataclass(frozen=True)
class Skipped:
    """A string array left undecoded (not asked for): only its length."""

    count: int


@dataclass
class Tensor:
    name: str
    shape: np.ndarray  # ne: innermost dim first, as GGUF stores it
    tensor_type: GGMLQuantizationType
    data_offset: int  # from the start of the file
    n_bytes: int
    data: np.ndarray


@dataclass
class Header:
    path: Path
    fields: dict[str, Any]
    tensors: list[Tensor]


class _Cursor:
    def __init__(self, buf: np.ndarray):
        self.buf, self.pos = buf, 0
        self._bytes = buf.data  # what struct reads (numpy's stubs give an ndarray no buffer type before 3.12)

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._bytes, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        start, end = self._skip_string()
        return bytes(self.buf[start:end]).decode("utf-8")

    def _skip_string(self) -> tuple[int, int]:
        """Steps over one string; returns where its bytes lie."""
        n = self.scalar("<Q")
        start, self.pos = self.pos, self.pos + n
        if self.pos > len(self.buf):
            raise IndexError("string past the end of the file")
        return start, self.pos

    def value(self, vtype: int, decode: bool = True):
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            return self.scalar(_SCALARS[vtype])
        item, count = self.scalar("<I"), self.scalar("<Q")
        if item == _STRING:
            if not decode:
                for _ in range(count):
                    self._skip_string()
                return Skipped(count)
            return [self.string() for _ in range(count)]
        if item == _ARRAY:
            return [self.value(_ARRAY, decode) for _ in range(count)]
        dtype = np.dtype(_SCALARS[item])
        values = np.frombuffer(self.buf, dtype, count, self.pos)
        self.pos += count * dtype.itemsize
        return values.tolist()


def read_header(path: str | Path, decode: Container[str] = ()) -> Header:
    """Metadata and checked tensor records; string arrays are decoded only for the keys in `decode`."""
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"{path}: no such GGUF file. Check the path.")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFormatError(f"{path}: not a GGUF file (wrong magic {magic!r}). Use a llama.cpp .gguf file.")
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(buf)
    cur.pos = 4
    try:
        version = cur.scalar("<I")
        if version not in (2, 3):
            raise ModelFormatError(
                f"{path}: GGUF version {version} is not supported (2 and 3 are; a big-endian "
                "file reads as a huge version). Use a current llama.cpp file."
            )
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.scalar("<I")
            fields[key] = cur.value(vtype, decode=key in decode or not key.startswith("tokenizer.ggml."))
        records = [_tensor_record(cur) for _ in range(n_tensors)]
    except (struct.error, IndexError, KeyError, ValueError, UnicodeDecodeError) as exc:
        raise ModelFormatError(f"{path}: truncated or corrupt GGUF header ({exc}). Download the file again.") from None
    alignment = int(fields.get("general.alignment", 32) or 32)
    data_start = -(-cur.pos // alignment) * alignment
    tensors = [_checked(path, buf, data_start, *record) for record in records]
    return Header(path, fields, tensors)


def _tensor_record(cur: _Cursor) -> tuple[str, list[int], int, int]:
    name = cur.string()
    n_dims = cur.scalar("<I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise ValueError(f"tensor {name} has {n_dims} dimensions")
    dims = [cur.scalar("<Q") for _ in range(n_dims)]
    return name, dims, cur.scalar("<I"), cur.scalar("<Q")


def _checked(
    path: Path, buf: np.ndarray, data_start: int, name: str, dims: list[int], type_id: int, offset: int
) -> Tensor:
    def corrupt(problem: str) -> ModelFormatError:
        return ModelFormatError(f"{path}: corrupt GGUF: tensor {name} {problem}. Download the file again.")

    if any(d == 0 for d in dims):
        raise corrupt(f"has a zero dimension (ne {dims})")
    if any(d >= 2**63 for d in dims):
        raise corrupt(f"has a negative dimension (ne {[d - 2**64 if d >= 2**63 else d for d in dims]})")
    try:
        ggml_type = GGMLQuantizationType(type_id)
    except ValueError:
        raise corrupt(f"has unknown type id {type_id}") from None
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    if dims[0] % block:
        raise corrupt(f"has rows of {dims[0]} values, not whole {ggml_type.name} blocks of {block}")
    n_elements = int(np.prod(dims, dtype=object))
    n_bytes = n_elements // block * type_size
    start = data_start + offset
    if start + n_bytes > len(buf):
        raise corrupt(f"ends past the end of the file ({start + n_bytes} > {len(buf)} bytes; truncated?)")
    shape = tuple(reversed(dims))
    raw = buf[start : start + n_bytes]
    if ggml_type in _FLOAT_DTYPES:
        data = raw.view(_FLOAT_DTYPES[ggml_type]).reshape(shape)
    else:  # BF16 and the block formats: bytes, one row of blocks per row
        data = raw.reshape(*shape[:-1], dims[0] // block * type_size)
    return Tensor(name, np.array(dims, dtype=np.uint64), ggml_type, start, n_bytes, data)
