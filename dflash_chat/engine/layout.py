"""Float matrices laid out for the CPU's BLAS.

An nn.Linear weight [out, in] on the CPU is stored column-major: the same values, held as the transpose of
a contiguous [in, out], so the matmul inside F.linear reads it without a transpose. Where the weights
stream from memory (a model bigger than the cache, as every decode step of one is), MKL reads a matrix laid
out so at a few rows far faster than a row-major one (commit 8b1bd3f has the figures). Every reader of
`.weight` sees the same values. It runs before `fuse_projections`, which keeps the layout in the matrices
it stacks. On a GPU the layout stays as loaded.
"""

from __future__ import annotations

from torch import nn


def lay_out_for_cpu(model: nn.Module) -> None:
    """Re-lay the CPU float Linear weights of `model` column-major, in place; a matrix shared with another
    module (a head tied to the embeddings) stays shared."""
    relaid: dict[int, nn.Parameter] = {}
    for module in model.modules():
        w = getattr(module, "weight", None)
        if (
            isinstance(module, nn.Linear)
            and w is not None
            and w.device.type == "cpu"
            and w.is_floating_point()
            and id(w) not in relaid
        ):
            relaid[id(w)] = nn.Parameter(w.detach().t().contiguous().t(), requires_grad=w.requires_grad)
    if not relaid:
        return
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) in relaid:
                module._parameters[name] = relaid[id(param)]
