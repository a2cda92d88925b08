"""A check that code reads no value from the device: under `NoHostReads`, anything that would make the host
wait for the GPU (reading a scalar or a list, data-dependent shapes such as nonzero or a boolean mask)
raises. On the CPU nothing would wait, so this is how the suite proves a step could be a CUDA graph."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ops whose result (or its shape) depends on tensor values: on CUDA each one waits for the device
_DATA_DEPENDENT = {
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::masked_select",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::bincount",
}


class HostRead(AssertionError):
    pass


class NoHostReads(TorchDispatchMode):
    def __enter__(self):
        self._tolist = torch.Tensor.tolist

        def tolist(t):
            raise HostRead("tolist() reads the device")

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in _DATA_DEPENDENT:
            raise HostRead(f"{name} reads the device")
        if name in ("aten::index", "aten::index_put_", "aten::index_put") and any(
            torch.is_tensor(i) and i.dtype == torch.bool for i in (args[1] or ()) if i is not None
        ):
            raise HostRead(f"{name} with a boolean mask has a data-dependent shape")
        if name == "aten::repeat_interleave" and torch.is_tensor(args[1] if len(args) > 1 else args[0]):
            raise HostRead(f"{name} has a data-dependent shape")
        return func(*args, **(kwargs or {}))
