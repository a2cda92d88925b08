"""The kernels a decode, verify, commit and draft step would launch on a GPU, counted per layer on any machine.

The real host code runs the real model (random packed weights at real shapes, bench/synthetic_models.py) with
every kernel choice made as on CUDA (the Triton paths wanted, TRITON_INTERPRET=1 only so the host code
takes them) while the Triton launches are recorded instead of run (compile_check.capture) and
every torch operator that would run a kernel is counted (a dispatch mode; views and allocations are
free). Forward hooks on the decoder layers split the counts per layer. Launch outputs are left as
allocated, which nothing can notice: the steps read no value back to the host.

On a GPU, `bench --synthetic` counts the same steps with the profiler; this is the count a machine
without one can check (tools/kernel_count.py, and a test holds the goal of at most 12 per layer).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
FREE = {  # operators that launch no kernel (allocations, metadata, aliases)
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten._unsafe_view.default,
    aten.lift_fresh.default,
}
WANTED = ("TRITON_INTERPRET", "DFLASH_CHAT_TRITON_ATTENTION", "DFLASH_CHAT_TRITON_GDN")


class Operators(TorchDispatchMode):
    """Counts the torch operators that run a kernel, by name; `host_reads` counts values read back."""

    def __init__(self) -> None:
        super().__init__()
        self.names: Counter[str] = Counter()
        self.host_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten._local_scalar_dense.default:
            self.host_reads += 1
        elif not func.is_view and func not in FREE:
            self.names[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


@dataclass
class Tally:
    """Kernels of one call: per layer (in order) and outside the layers."""

    layers: list[Counter] = field(default_factory=list)
    outside: Counter = field(default_factory=Counter)
    host_reads: int = 0

    def per_layer(self) -> list[int]:
        return [sum(c.values()) for c in self.layers]

    @property
    def total(self) -> int:
        return sum(self.per_layer()) + sum(self.outside.values())


@contextlib.contextmanager
def gpu_choices():
    """The kernel choices of a CUDA machine on this one (the env switches, read again on the way in and out). The
    kernel modules are imported first: TRITON_INTERPRET at their import would make them interpreter builds
    for the rest of the process."""
    from dflash_chat.engine.kernels import switches, triton_attention, triton_gdn, triton_glue, triton_quant  # noqa: F401
    from dflash_chat.engine.kernels.first_use import checked as _checked

    saved = {name: os.environ.get(name) for name in WANTED}
    checked = dict(_checked)
    os.environ.update({name: "1" for name in WANTED})
    switches.reload()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        switches.reload()
        _checked.clear()
        _checked.update(checked)


def count(call, layers) -> Tally:
    """Kernels `call()` launches, split at the forward of each module in `layers`."""
    from dflash_chat.bench import compile_check
    from dflash_chat.engine.kernels import configs, first_use

    tally = Tally(layers=[Counter() for _ in layers])
    ops = Operators()
    launches: list = []
    entered: list[tuple[int, Counter]] = []

    def so_far() -> Counter:
        return ops.names + Counter(f"triton:{c.kernel.__name__}" for c in launches)

    def enter(i):
        return lambda module, args: entered.append((i, so_far()))

    def leave(module, args, out):
        i, before = entered.pop()
        tally.layers[i] += so_far() - before

    hooks = [layer.register_forward_pre_hook(enter(i)) for i, layer in enumerate(layers)]
    hooks += [layer.register_forward_hook(leave) for layer in layers]
    agrees = first_use.agrees
    first_use.agrees = lambda *args, **kwargs: True  # the first-use checks would compare recorded launches
    try:
        with compile_check.capture(configs.FAMILIES["sm_90"]) as launches, ops:
            call()
    finally:
        first_use.agrees = agrees
        for hook in hooks:
            hook.remove()
    tally.outside = so_far() - sum(tally.layers, Counter())
    tally.host_reads = ops.host_reads
    return tally


def warm_count(call, layers) -> Tally:
    """`count` of the second call: the first makes what a warm-up makes once (buffers, first-use checks)."""
    count(call, layers)
    return count(call, layers)


@dataclass
class Steps:
    """Per-step tallies of one model: decode (1 token) and verify (B tokens) per target layer; commit and the
    draft (B tokens; the drafter's layers are no module calls to split at) in all."""

    decode: Tally
    verify: Tally
    commit: Tally
    draft: Tally
    layer_types: list[str]
    drafter_layers: int

    def by_kind(self, tally: Tally) -> dict[str, int]:
        """Kernels per layer of each kind (the most any layer of that kind takes)."""
        kinds: dict[str, int] = {}
        for kind, n in zip(self.layer_types, tally.per_layer(), strict=True):
            kinds[kind] = max(kinds.get(kind, 0), n)
        return kinds


def count_steps(
    name: str, mix: str = "Q4_K_M", layers: int = 4, block: int = 16, vocab: int = 4096, context: int = 256
) -> Steps:
    """Build `name` (a synthetic model: real shapes, `layers` layers, a small vocabulary) in bf16 on the CPU
    and count what each fixed-shape step launches with the GPU's kernel choices."""
    from dflash_chat.bench import synthetic_models
    from dflash_chat.engine.models.span import Span

    saved = synthetic_models.TARGETS[name]
    synthetic_models.TARGETS[name] = {**saved, "vocab_size": vocab}
    try:
        with gpu_choices():
            target = synthetic_models.build_target(name, mix, layers, "cpu", torch.bfloat16)
            drafter = synthetic_models.build_drafter(name, target, "bf16" if mix == "bf16" else "Q8_0")
            drafter.block_size = block
            state = target.new_state(context, block)
            drafter.allocate(context)
            start = torch.tensor(context // 2)
            offsets = torch.arange(block)
            ids = torch.zeros(block, dtype=torch.long)
            taps = list(drafter.target_layer_ids)
            target_layers = list(target.model.layers)
            keep = torch.tensor(block // 2)
            decode = warm_count(
                lambda: target(ids[:1], state, logits="all", span=Span.fixed(start, offsets[:1], context)),
                target_layers,
            )
            verify = warm_count(
                lambda: target(
                    ids, state, logits="all", taps=taps, speculative=True, span=Span.fixed(start, offsets, context)
                ),
                target_layers,
            )
            commit = warm_count(lambda: target.commit(state, keep), [])
            draft_ids = drafter.block_ids(torch.device("cpu"))
            draft = warm_count(lambda: drafter.draft_logits(draft_ids, Span.fixed(start, offsets, context)), [])
    finally:
        synthetic_models.TARGETS[name] = saved
    return Steps(decode, verify, commit, draft, list(target.cfg.layer_types), len(drafter.layers))
