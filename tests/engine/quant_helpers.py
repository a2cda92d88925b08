"""Random packed blocks for the quantization tests (valid fp16 scales, random everything else)."""

from __future__ import annotations

import numpy as np

from dflash_chat.engine.ggml.formats import Format

# byte offsets of the fp16 fields (d, dmin, m) in each block layout
FP16_FIELDS = {
    "Q4_0": (0,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def random_rows(fmt: Format, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, row_bytes] of random blocks whose scale fields are finite fp16 values."""
    rng = np.random.default_rng(seed)
    if not fmt.quantized:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        if fmt.name == "BF16":
            return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return x.astype(np.float16 if fmt.name == "F16" else np.float32).view(np.uint8)
    nb = rows * cols // fmt.block_size
    blocks = rng.integers(0, 256, size=(nb, fmt.type_size), dtype=np.uint8)
    for at in FP16_FIELDS[fmt.name]:
        scale = (rng.standard_normal(nb) * 0.01).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, -1)


def one_thread():
    """Generator for an autouse fixture: torch ops on tiny tensors run far faster single-threaded on a busy box."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def overwrite_parameters(model, tensors: dict) -> None:
    """Copy float `tensors` into every parameter of a loaded float `model` (conv1d weights may come as [C, K]).

    Fused projections (models/fused.py) are views of one storage: writing the checkpoint's names fills them."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".shared." not in name:
                p.copy_(tensors[name].reshape(p.shape))
