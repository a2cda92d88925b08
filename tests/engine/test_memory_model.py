"""The memory model (engine/memory.py) against the bytes the engine really holds.

Real tiny pairs of each architecture are loaded by the real loader on the CPU (float32), run through
a prefill and a few DFlash steps (greedy, then sampled), and every tensor reachable from the Engine that is not a weight
(parameters and registered buffers) is counted once per storage. That sum must match
memory.state_bytes within 5%: an engine buffer the model leaves out, or a rule that drifts (the
prefill chunk, the number of recurrent copies, the dtype), fails here.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from dflash_chat.engine import memory
from dflash_chat.engine.load import load_pair
from dflash_chat.engine.memory import DrafterShape, TargetShape
from dflash_chat.engine.sampling_params import SamplingParams
from tests.engine.conftest import ARCHS
from tests.engine.tiny import write_drafter

# A short context, where the recurrent state is a large share (a missing copy shows), and a longer
# one, where the caches dominate; both longer than the tiny drafter's sliding window (8).
CONTEXTS = (64, 600)
PROMPT = [4, 5, 6, 7, 8, 9, 10, 11] * 3


def held_bytes(root) -> int:
    """Bytes of every tensor storage reachable from `root` that is not a weight, each counted once."""
    storages: dict[int, int] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if not isinstance(obj, nn.Parameter):
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, nn.Module):  # weights live in _parameters and _buffers
            stack.extend(v for k, v in vars(obj).items() if k not in ("_parameters", "_buffers"))
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif not isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)) and hasattr(
            obj, "__dict__"
        ):
            stack.extend(vars(obj).values())
    return sum(storages.values())


def loaded(target_dir, drafter_dir, context):
    """An engine after a greedy answer and a sampled one (which makes the sampling buffers)."""
    engine = load_pair(target_dir, drafter_dir, device="cpu", max_context=context).engine
    for params in (SamplingParams(max_new_tokens=16), SamplingParams(temperature=0.7, max_new_tokens=16, seed=1)):
        for _ in engine.generate(PROMPT, params):
            pass
    return engine


def estimate(engine) -> int:
    drafter = DrafterShape.of(engine.drafter.cfg) if engine.drafter else None
    e = memory.compute_bytes(str(engine.device))
    return memory.state_bytes(TargetShape.of(engine.target.cfg), drafter, engine.max_context, e).total


def assert_close(held: int, estimated: int) -> None:
    assert abs(held - estimated) <= 0.05 * held, f"engine holds {held} bytes, the memory model says {estimated}"


@pytest.fixture(scope="module")
def full_drafters(tiny_dirs, tmp_path_factory):
    """arch -> a drafter of full-attention layers only for that arch's tiny target."""
    out = {}
    for arch in ARCHS:
        target = tiny_dirs[arch][0]
        directory = tmp_path_factory.mktemp(f"{arch}-full-drafter")
        write_drafter(directory, target, seed=3, layer_types=["full_attention", "full_attention"])
        out[arch] = directory
    return out


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_estimate_is_what_the_engine_allocates(tiny_dirs, full_drafters, arch, context):
    engine = loaded(tiny_dirs[arch][0], full_drafters[arch], context)
    assert engine.snapshot is not None  # the prefill ran and left its snapshot
    assert_close(held_bytes(engine), estimate(engine))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_estimate_without_a_drafter(tiny_dirs, arch):
    engine = loaded(tiny_dirs[arch][0], None, CONTEXTS[0])
    assert_close(held_bytes(engine), estimate(engine))


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_the_estimate_with_the_targets_mtp_layer(mtp_dirs, arch):
    """A target with its own MTP layer and no drafter: the layer's cache, the features it reads and the widths
    of its drafts and of prompt lookup's."""
    engine = loaded(mtp_dirs[arch][0], None, CONTEXTS[1])
    assert engine.mtp is not None and memory.state_bytes(TargetShape.of(engine.target.cfg), None, 600, 4).mtp
    assert_close(held_bytes(engine), estimate(engine))


def test_sliding_window_layers_hold_only_their_window(tiny_dirs):
    target = tiny_dirs["qwen3_5"][0]
    engine = loaded(target, tiny_dirs["qwen3_5"][1], CONTEXTS[1])  # one sliding (window 8) and one full layer
    assert DrafterShape.of(engine.drafter.cfg).sliding_layers == 1
    assert_close(held_bytes(engine), estimate(engine))


def test_the_estimate_for_a_dflash2_drafter(tiny_dirs, tmp_path):
    target = tiny_dirs["qwen3_5"][0]
    write_drafter(tmp_path / "d2", target, seed=4, block_size=8, dflash2=True)
    engine = loaded(target, tmp_path / "d2", CONTEXTS[1])
    assert DrafterShape.of(engine.drafter.cfg).kind == "dflash2"
    assert_close(held_bytes(engine), estimate(engine))


def test_the_counter_sees_a_buffer_the_model_does_not_know(tiny_dirs, full_drafters):
    """The measurement is not blind: one extra copy of the target's KV caches on the engine breaks the 5%."""
    engine = loaded(tiny_dirs["qwen3_5"][0], full_drafters["qwen3_5"], CONTEXTS[0])
    engine.extra = [torch.zeros_like(c.k) for c in engine.state.layers if hasattr(c, "k") for _ in "kv"]
    with pytest.raises(AssertionError):
        assert_close(held_bytes(engine), estimate(engine))


def test_the_compute_dtype_is_the_loaders():
    from dflash_chat.engine.load import default_dtype

    for device in ("cpu", "cuda"):
        dtype = default_dtype(torch.device(device))
        assert memory.compute_bytes(device) == torch.tensor([], dtype=dtype).element_size()


def test_a_checkpoint_holds_what_the_memory_model_says(tiny_dirs):
    """engine/prefix_cache.py's checkpoints, as `checkpoint_bytes` counts them (doctor divides the budget by it)."""
    engine = load_pair(tiny_dirs["qwen3_5"][0], tiny_dirs["qwen3_5"][1], device="cpu", max_context=CONTEXTS[1]).engine
    for _ in engine.generate(PROMPT, SamplingParams(max_new_tokens=4), marks=[12]):
        pass
    assert engine.checkpoints.lengths == [12]
    drafter = DrafterShape.of(engine.drafter.cfg)
    e = memory.compute_bytes(str(engine.device))
    one = memory.checkpoint_bytes(TargetShape.of(engine.target.cfg), drafter, engine.max_context, e)
    assert engine.checkpoints.best(12).nbytes == one
    assert engine.snapshot.nbytes == one + TargetShape.of(engine.target.cfg).vocab * memory.LOGIT_BYTES
