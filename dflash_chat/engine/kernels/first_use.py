"""The first use of a Triton kernel per format, device and dtype is checked against the torch path.

A driver, GPU or Triton version the kernels were never run on then costs speed, not correctness. The check
synchronises, so run one eager step (warm-up) before capturing a CUDA graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from dflash_chat.engine.ggml.formats import Format

# (kind, format name, device, dtype) -> whether the kernel agreed with the torch path
checked: dict[tuple, bool] = {}

Probe = Callable[[torch.Tensor, Format, torch.dtype], bool]


def agrees(kind: str, probe: Probe, packed: torch.Tensor, fmt: Format, dtype: torch.dtype) -> bool:
    """`probe` must say the kernel matches the torch path on real rows (once; the answer is kept in `checked`).

    The probe builds its own inputs (never the caller's), so it cannot index outside them whatever the batch
    looks like.
    """
    key = (kind, fmt.name, packed.device, dtype)
    ok = checked.get(key)
    if ok is None:
        try:
            ok = probe(packed, fmt, dtype)
            reason = "results differ from the torch path"
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch path
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            warnings.warn(
                f"Triton {kind} {fmt.name} kernel disabled on {packed.device} ({reason}); using the slower torch path",
                stacklevel=3,
            )
        checked[key] = ok
    return ok


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    got, want = got.float(), want.float()
    return bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item() + 1e-3))


def probe_input(rows: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
