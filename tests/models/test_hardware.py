"""The picker over a table of machines (a probe double: the GPU is what cannot exist here)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types

import pytest

from dflash_chat.engine import memory
from dflash_chat.errors import UserError
from dflash_chat.models import hardware
from dflash_chat.models.catalog import load_catalog
from dflash_chat.models.hardware import GIB, Gpu, Machine, NoFitError, budget, choose
from dflash_chat.models.sizes import size_text

GPUS = {
    8: "RTX 4060",
    12: "RTX 3060",
    16: "RTX 4080",
    20: "RTX 4000 Ada",
    24: "RTX 3090",
    32: "RTX 5090",
    48: "RTX A6000",
    80: "H100",
}


def machine(size_gb: int, used_gb: float = 0.4) -> Machine:
    """A machine with one GPU of `size_gb` (`used_gb` taken by the desktop), or CPU-only for 0."""
    if size_gb == 0:
        return Machine((), 16 * GIB, 12 * GIB, "CPU-only build of torch")
    total = size_gb * GIB
    gpu = Gpu(0, f"NVIDIA GeForce {GPUS[size_gb]}", total, int(total - used_gb * GIB))
    return Machine((gpu,), 64 * GIB, 48 * GIB)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    return load_catalog(tmp_path_factory.mktemp("cfg") / "config.toml")


def search_order(catalog, m: Machine):
    """Every (pair, target, drafter) in the order the picker prefers them (drafter None: a target with its own
    MTP layer alone, after its drafters, or before them for the MoE target)."""
    pairs = [p for p in catalog.ranked() if p.cpu_default] if m.gpu is None else catalog.ranked()
    return [(p, t, d) for p in pairs for t in p.targets for d in hardware._drafters(p, None, None)]


# What fits where: the spec of the picker. Pairs by rank (Qwen3.8-27B, Qwen3.6-27B, 35B-A3B, 9B, 4B),
# target Q8_0 before Q4_K_M before the 3-bit quants (Q3_K_M, then Qwen3.8's Q3_K_S), drafter Q8_0
# before BF16 before Q4_K_M; on the CPU (16 GiB RAM, the engine computing in float32 there) the
# cpu_default pair (4B). Qwen3.8-27B + DFlash2 takes every row Qwen3.6-27B + DFlash had (same shapes,
# files within a few percent, a smaller context cache and block). Where no drafter fits beside the best
# target quant that fits, that quant runs alone with its own MTP layer (drafter None): 16 GB at 8k, 20 GB at
# 8k, 24 GB at 128k. QWEN36 below keeps what the Qwen3.6-27B pair does on its own.
TABLE = {
    # size  context: (pair, target quant, drafter quant) or None (nothing fits)
    (0, 8192): ("qwen3.5-4b", "Q8_0", "BF16"),
    (0, 32768): ("qwen3.5-4b", "Q8_0", "BF16"),
    (0, 131072): None,  # float32 caches on the CPU
    (8, 8192): ("qwen3.5-4b", "Q8_0", "BF16"),
    (8, 32768): ("qwen3.5-4b", "Q4_K_M", "BF16"),
    (8, 131072): None,
    (12, 8192): ("qwen3.5-9b", "Q4_K_M", "BF16"),
    (12, 32768): ("qwen3.5-9b", "Q4_K_M", "BF16"),
    (12, 131072): None,
    (16, 8192): ("qwen3.8-27b", "Q3_K_M", None),  # the 27B at 3 bits alone: no drafter fits beside it
    (16, 32768): ("qwen3.5-9b", "Q8_0", "BF16"),
    (16, 131072): ("qwen3.5-4b", "Q8_0", "BF16"),
    (20, 8192): ("qwen3.8-27b", "Q4_K_M", None),  # Q4_K_M alone, before Q3_K_M with a drafter
    (20, 32768): ("qwen3.8-27b", "Q3_K_M", "Q8_0"),  # Q4_K_M does not fit beside any drafter
    (20, 131072): ("qwen3.5-9b", "Q4_K_M", "BF16"),
    (24, 8192): ("qwen3.8-27b", "Q4_K_M", "Q8_0"),
    (24, 32768): ("qwen3.8-27b", "Q4_K_M", "Q8_0"),
    (24, 131072): ("qwen3.8-27b", "Q3_K_S", None),  # the 27B alone, before the 9B with a drafter
    (32, 8192): ("qwen3.8-27b", "Q8_0", None),  # Q8_0 target first: beside its MTP cache no drafter fits, so alone
    (32, 32768): ("qwen3.8-27b", "Q4_K_M", "Q8_0"),
    (32, 131072): ("qwen3.8-27b", "Q4_K_M", "Q8_0"),
    (48, 8192): ("qwen3.8-27b", "Q8_0", "Q8_0"),
    (48, 32768): ("qwen3.8-27b", "Q8_0", "Q8_0"),
    (48, 131072): ("qwen3.8-27b", "Q8_0", "Q8_0"),
    (80, 8192): ("qwen3.8-27b", "Q8_0", "Q8_0"),
    (80, 32768): ("qwen3.8-27b", "Q8_0", "Q8_0"),
    (80, 131072): ("qwen3.8-27b", "Q8_0", "Q8_0"),
}

# The Qwen3.6-27B pair's own choices (--model qwen3.6-27b): what the picker chose before Qwen3.8 came.
QWEN36 = {
    (20, 8192): ("Q4_K_M", "Q4_K_M"),
    (20, 32768): ("Q3_K_M", "Q8_0"),
    (24, 8192): ("Q4_K_M", "Q8_0"),
    (24, 32768): ("Q4_K_M", "Q8_0"),
    (32, 8192): ("Q8_0", "Q4_K_M"),
    (32, 32768): ("Q4_K_M", "Q8_0"),
    (32, 131072): ("Q4_K_M", "Q8_0"),
    (48, 8192): ("Q8_0", "Q8_0"),
    (48, 131072): ("Q8_0", "Q8_0"),
    (80, 131072): ("Q8_0", "Q8_0"),
}


@pytest.mark.parametrize(("size", "context"), sorted(QWEN36))
def test_the_qwen36_27b_pair_keeps_its_choices(catalog, size, context):
    m = machine(size)
    choice = choose(m, catalog, model="qwen3.6-27b", context=context)
    assert (choice.target.quant, choice.drafter.quant) == QWEN36[size, context] and choice.fits
    assert "DFlash2" not in choice.explanation and " + drafter " in choice.explanation
    pair = catalog.get("qwen3.6-27b")
    order = [(t, d) for t in pair.targets for d in pair.drafters]
    index = order.index((choice.target, choice.drafter))
    assert not any(budget(pair, t, d, context, m).fits for t, d in order[:index])


@pytest.mark.parametrize(("size", "context"), sorted(TABLE))
def test_picker_table(catalog, size, context):
    m = machine(size)
    expected = TABLE[size, context]
    if expected is None:
        with pytest.raises(NoFitError):
            choose(m, catalog, context=context)
        assert not any(budget(p, t, d, context, m).fits for p, t, d in search_order(catalog, m))
        return
    choice = choose(m, catalog, context=context)
    drafter = choice.drafter.quant if choice.drafter else None
    assert (choice.pair.name, choice.target.quant, drafter) == expected
    assert choice.fits and choice.budget.need <= m.available
    assert choice.device == ("cpu" if size == 0 else "cuda:0")
    # everything the picker prefers to its choice really does not fit
    order = search_order(catalog, m)
    index = order.index((choice.pair, choice.target, choice.drafter))
    assert not any(budget(p, t, d, context, m).fits for p, t, d in order[:index])


@pytest.mark.parametrize("context", [8192, 32768, 131072, 262144])
def test_more_memory_never_picks_worse_and_longer_context_never_picks_better(catalog, context):
    def position(size, ctx):
        m = machine(size)
        try:
            c = choose(m, catalog, context=ctx)
        except NoFitError:
            return len(search_order(catalog, machine(80)))
        return search_order(catalog, machine(80)).index((c.pair, c.target, c.drafter))

    sizes = [8, 12, 16, 20, 24, 32, 48, 80]
    by_size = [position(s, context) for s in sizes]
    assert by_size == sorted(by_size, reverse=True)
    for size in sizes:
        assert position(size, context) <= position(size, context * 2)


def left_for_context(choice) -> int:
    b = choice.budget
    return b.available - b.target - b.drafter - b.workspace - b.margin


def test_explanation_is_one_line_like_the_issue(catalog):
    """On 24 GB the pick is Qwen3.8-27B with its DFlash2 drafter, and the line says why."""
    choice = choose(machine(24), catalog, context=32768)
    left = left_for_context(choice)
    assert choice.explanation == (
        f"RTX 3090 24 GiB: Qwen3.8-27B Q4_K_M + DFlash2 drafter Q8_0 (DFlash2 drafts 8-token blocks with "
        f"~20 % longer acceptance); {size_text(left)} left for a 32k context"
    )
    assert size_text(left) == "3.69 GB" and left >= choice.budget.state
    dflash = choose(machine(24), catalog, model="qwen3.6-27b", context=32768)
    assert dflash.explanation == (
        f"RTX 3090 24 GiB: Qwen3.6-27B Q4_K_M + drafter Q8_0; {size_text(left_for_context(dflash))} left for a 32k context"
    )
    assert choose(machine(8), catalog, context=8192).explanation.endswith("left for an 8k context")


@pytest.mark.parametrize(
    ("size", "context", "expected"),
    [
        (
            16,
            8192,
            "RTX 4080 16 GiB: Qwen3.8-27B Q3_K_M alone, drafting with its own MTP layer (no drafter fits "
            "beside it); 1.15 GB left for an 8k context",
        ),
        (
            24,
            32768,
            "RTX 3090 24 GiB: Qwen3.8-27B Q4_K_M + DFlash2 drafter Q8_0 (DFlash2 drafts 8-token blocks "
            "with ~20 % longer acceptance); 3.69 GB left for a 32k context",
        ),
        (
            48,
            32768,
            "RTX A6000 48 GiB: Qwen3.8-27B Q8_0 + DFlash2 drafter Q8_0 (DFlash2 drafts 8-token blocks "
            "with ~20 % longer acceptance); 16.2 GB left for a 32k context",
        ),
    ],
)
def test_the_qwen38_pair_and_its_reason_on_16_24_and_48_gb(catalog, size, context, expected):
    choice = choose(machine(size), catalog, context=context)
    assert choice.explanation == expected
    assert choice.pair.name == "qwen3.8-27b"
    assert choice.drafter.shape.kind == "dflash2" if choice.drafter else choice.methods == ("mtp", "lookup")
    # the figure is what is left once the weights, workspace and margin are placed; the state fits in it
    assert size_text(left_for_context(choice)) in expected and left_for_context(choice) >= choice.budget.state


def test_cpu_takes_the_cpu_default_pair_when_asked_to_choose(catalog):
    choice = choose(machine(0), catalog, context=8192)
    assert choice.pair.cpu_default and choice.device == "cpu"
    assert choice.explanation.startswith("CPU, 16 GiB RAM: Qwen3.5-4B Q8_0 + drafter BF16;")


def test_nothing_fits_says_what_the_smallest_needs(catalog):
    tiny = Machine((Gpu(0, "NVIDIA GeForce GTX 1650", 4 * GIB, int(3.6 * GIB)),), 16 * GIB, 8 * GIB)
    with pytest.raises(NoFitError) as err:
        choose(tiny, catalog, context=32768)
    smallest = budget(
        catalog.get("qwen3.5-4b"),
        catalog.get("qwen3.5-4b").target("Q4_K_M"),
        catalog.get("qwen3.5-4b").drafter("BF16"),
        32768,
        tiny,
    )
    message = str(err.value)
    assert message.startswith(
        f"GTX 1650 4 GiB: nothing fits in the {size_text(tiny.available)} free; the smallest option, "
    )
    assert f"Qwen3.5-4B Q4_K_M + drafter BF16 with a 32k context, needs {size_text(smallest.need)}" in message
    assert "--context" in message and "\n" not in message


# --- the memory model behind the budget (engine/memory.py) ----------------------------------------


def test_the_budget_is_the_memory_models(catalog):
    """The picker adds up the engine's own sizing rules: no arithmetic of its own."""
    pair = catalog.get("qwen3.6-27b")
    target, drafter = pair.target("Q4_K_M"), pair.drafter("Q8_0")
    b = budget(pair, target, drafter, 32768, machine(24))
    assert b.state == memory.state_bytes(pair.target_shape, drafter.shape, 32768, 2).total
    assert b.workspace == memory.workspace_bytes(pair.target_shape, drafter.shape, 32768, 2)
    assert (b.target, b.drafter) == (target.size, drafter.size)  # GGUF tensors stay packed


def test_the_cpu_budget_is_float32(catalog):
    """The engine computes in float32 on the CPU: caches and a BF16 checkpoint take twice the bytes."""
    pair = catalog.get("qwen3.5-4b")
    target, drafter = pair.target("Q8_0"), pair.drafter("BF16")
    on_gpu = budget(pair, target, drafter, 8192, machine(24))
    on_cpu = budget(pair, target, drafter, 8192, machine(0))
    bf16, fp32 = (memory.state_bytes(pair.target_shape, drafter.shape, 8192, e) for e in (2, 4))
    assert (on_gpu.state, on_cpu.state) == (bf16.total, fp32.total)
    assert fp32.target_kv == 2 * bf16.target_kv and fp32.drafter_kv == 2 * bf16.drafter_kv
    assert fp32.gdn_recurrent == bf16.gdn_recurrent  # the recurrent state is float32 everywhere
    assert on_cpu.drafter == 2 * on_gpu.drafter == 2 * drafter.size
    assert on_cpu.target == on_gpu.target == target.size


def test_the_27b_drafters_sliding_layers_keep_only_their_window(catalog):
    """4 of the 27B drafter's 5 layers slide over 2048 positions: past that, only one layer grows."""
    pair = catalog.get("qwen3.6-27b")
    shape = pair.drafter("Q8_0").shape
    assert (shape.layers, shape.sliding_layers, shape.sliding_window) == (5, 4, 2048)
    short = memory.state_bytes(pair.target_shape, shape, 32768, 2)
    long = memory.state_bytes(pair.target_shape, shape, 65536, 2)
    per_position = 2 * shape.kv_heads * shape.head_dim * 2
    assert long.drafter_kv - short.drafter_kv == 32768 * per_position  # one full layer
    assert short.drafter_kv == (32768 + 16 + 4 * (2048 + 16)) * per_position
    # 64 layers, 16 of them full attention: K and V x 4 heads x 256 x bf16 x (32k + the block)
    assert short.target_kv == 16 * 2 * 4 * 256 * 2 * (32768 + 16)


def test_each_35b_drafter_source_is_sized_by_the_training_its_file_holds(catalog):
    pair = catalog.get("qwen3.6-35b-a3b")
    gguf, bf16 = pair.drafter("Q8_0"), pair.drafter("BF16")
    assert (gguf.version, gguf.shape.layers, gguf.shape.kv_heads, gguf.shape.sliding_layers) == ("2026-04", 8, 4, 0)
    assert (bf16.version, bf16.shape.layers, bf16.shape.kv_heads, bf16.shape.sliding_layers) == ("2026-06", 6, 8, 5)
    old = memory.state_bytes(pair.target_shape, gguf.shape, 131072, 2).drafter_kv
    new = memory.state_bytes(pair.target_shape, bf16.shape, 131072, 2).drafter_kv
    per_position = 2 * 128 * 2
    assert old == 8 * 4 * (131072 + 16) * per_position
    assert new == 8 * (5 * (4096 + 16) + 131072 + 16) * per_position


@pytest.mark.parametrize(("name", "size"), [("qwen3.8-27b", 13_820_000_000), ("qwen3.6-27b", 13_590_000_000)])
def test_the_27b_comes_at_q3_k_m_where_q4_k_m_does_not_fit(catalog, name, size):
    pair = catalog.get(name)
    twenty = machine(20)
    assert not any(budget(pair, pair.target("Q4_K_M"), d, 32768, twenty).fits for d in pair.drafters)
    choice = choose(twenty, catalog, model=name, context=32768)
    assert (choice.pair.name, choice.target.quant) == (name, "Q3_K_M")
    assert choice.target.patterns == ("*Q3_K_M*.gguf",) and choice.target.size == size
    assert choose(machine(24), catalog, model=name, context=32768).target.quant == "Q4_K_M"  # never where Q4_K_M fits
    assert choose(twenty, catalog, context=32768).pair.name == "qwen3.8-27b"  # the first pair by rank


def test_on_16_gb_the_qwen38_27b_comes_at_three_bits_beside_its_smallest_drafter(catalog):
    """A 16 GB card holds Qwen3.8-27B at Q3_K_S with the Q4_K_M DFlash2 GGUF at the app's 8k context:
    nothing bigger of the pair fits, and at 32k the 9B takes over."""
    pair, sixteen = catalog.get("qwen3.8-27b"), machine(16)
    fitting = [
        (t.quant, d.quant) for t in pair.targets for d in pair.drafters if budget(pair, t, d, 8192, sixteen).fits
    ]
    assert fitting == [("Q3_K_S", "Q4_K_M")]
    assert not any(budget(pair, t, d, 32768, sixteen).fits for t in pair.targets for d in pair.drafters)
    assert choose(sixteen, catalog, context=32768).pair.name == "qwen3.5-9b"


def test_the_qwen38_budget_counts_its_dflash2_drafter(catalog):
    """The DFlash2 pair's budget is the memory model's, with the drafter's own shape: its BF16
    checkpoint takes 3.85 GB in bf16 on the GPU and 7.7 GB in float32 on the CPU."""
    pair = catalog.get("qwen3.8-27b")
    target, bf16 = pair.target("Q4_K_M"), pair.drafter("BF16")
    b = budget(pair, target, bf16, 32768, machine(24))
    assert b.state == memory.state_bytes(pair.target_shape, DFLASH2, 32768, 2).total
    assert b.workspace == memory.workspace_bytes(pair.target_shape, DFLASH2, 32768, 2)
    assert (b.target, b.drafter) == (17_110_000_000, 3_850_000_000)
    assert budget(pair, target, bf16, 8192, machine(0)).drafter == 7_700_000_000
    # the BF16 drafter does not fit beside Q4_K_M at 32k on 24 GB; the 2.06 GB Q8_0 GGUF does
    assert not b.fits and budget(pair, target, pair.drafter("Q8_0"), 32768, machine(24)).fits


# Qwen3.8-27B's DFlash2 drafter (z-lab/Qwen3.8-27B-DFlash2 config.json): five sliding layers, block 8.
DFLASH2 = memory.DrafterShape(
    kind="dflash2",
    layers=5,
    sliding_layers=5,
    sliding_window=2048,
    kv_heads=8,
    head_dim=128,
    hidden=5120,
    block_size=8,
    taps=5,
    selector_top_k=16,
    selector_rank=256,
    conv_kernel=2,
    conv_group=16,
)


def test_a_dflash2_drafters_terms_from_its_shapes(catalog):
    """Every term of a DFlash2 pair at 32k, from the shapes by hand (bf16, e = 2)."""
    with_mtp = catalog.get("qwen3.6-27b").target_shape  # Qwen3.8-27B has the same shapes
    target = dataclasses.replace(with_mtp, mtp=False)  # the MTP layer's terms are checked below
    state = memory.state_bytes(target, DFLASH2, 32768, 2)
    rows = 32768 + 8  # the verify writes up to B - 1 = 7 positions past the committed ones
    assert state.target_kv == 16 * 2 * rows * 4 * 256 * 2
    assert state.target_rope == 2 * rows * 64 * 2
    assert state.gdn_recurrent == 48 * 2 * (48 * 128 * 128 * 4)
    conv_channels = 2 * 16 * 128 + 48 * 128  # q, k, v
    assert state.gdn_conv == 48 * 2 * 3 * conv_channels * 2
    # a verify of 8 tokens leaves its conv output, b and a, and the conv window for the commit
    assert state.gdn_verify == 48 * (8 * (conv_channels + 2 * 48) + (3 + 8) * conv_channels) * 2
    # five sliding layers hold their 2048-position window and the block: K and V x 8 heads x 128
    assert state.drafter_kv == 5 * (2048 + 8) * 2 * 8 * 128 * 2
    assert state.drafter_rope == 2 * rows * 128 * 2
    # the prefill snapshot keeps a copy of those five rings (a branching prompt drafts from it again)
    assert state.snapshot_rings == 5 * (2048 + 8) * 2 * 8 * 128 * 2
    # `auto` verifies 1, 4 or 8 tokens (and 2, prompt lookup's shortest): logits in float32 and the 5 taps'
    # features per row
    assert state.step_outputs == (1 + 2 + 4 + 8) * (248320 * 4 + 5 * 5120 * 2)
    assert state.sampling == (8 + 7 + 7) * 248320 * 4 + 7 * 4
    # 7 draft positions x 16 candidates: id (int64), score and q (float32), and rank-256 rows for
    # proj(h) and the 16 successor codebook rows in bf16
    assert state.selector == 7 * (16 * (8 + 4 + 4) + 17 * 256 * 2) == 62_720
    # 5 layers x (attention_conv, mlp_conv) x 8 positions x 2 x kernel 2 x 320 groups (5120 / 16) in bf16
    assert state.draft_conv == 5 * 2 * 8 * 2 * 2 * 320 * 2 == 204_800
    assert state.snapshot_logits == 248320 * 4
    parts = (
        state.target_kv,
        state.target_rope,
        state.gdn_recurrent,
        state.gdn_conv,
        state.gdn_verify,
        state.snapshot_logits,
        state.drafter_kv,
        state.drafter_rope,
        state.snapshot_rings,
        state.step_outputs,
        state.sampling,
        state.selector,
        state.draft_conv,
        state.mtp,
    )
    assert state.mtp == 0  # a target without an MTP layer
    assert state.total == sum(parts)
    # the catalog's target carries one: its K/V cache (one attention layer, 4 KV heads of 256) over the rows,
    # and the newest hidden state (twice: kept and staged)
    assert with_mtp.mtp
    assert memory.state_bytes(with_mtp, DFLASH2, 32768, 2).mtp == (2 * rows * 4 * 256 + 2 * 5120) * 2


def test_a_dflash2_drafters_cache_stops_growing_at_its_window(catalog):
    target = catalog.get("qwen3.6-27b").target_shape
    per_position = 2 * 8 * 128 * 2
    short = memory.state_bytes(target, DFLASH2, 1000, 2).drafter_kv
    assert short == 5 * (1000 + 8) * per_position  # shorter than the window: every position
    long, longer = (memory.state_bytes(target, DFLASH2, c, 2).drafter_kv for c in (65536, 262144))
    assert long == longer == 5 * (2048 + 8) * per_position  # no full-attention layer grows with C
    on_cpu = memory.state_bytes(target, DFLASH2, 32768, 4)  # float32 on the CPU, the ids stay int64
    assert on_cpu.selector == 7 * (16 * 16 + 17 * 256 * 4) and on_cpu.draft_conv == 2 * 204_800


def test_dflash_drafters_have_no_dflash2_terms(catalog):
    """The DFlash terms are what they were: a DFlash drafter has no selector and no convolutions."""
    pair = catalog.get("qwen3.6-27b")
    shape = pair.drafter("Q8_0").shape
    assert shape.kind == "dflash" and shape.problem() is None
    state = memory.state_bytes(pair.target_shape, shape, 32768, 2)
    assert state.selector == state.draft_conv == 0
    assert state.sampling == (16 + 15 + 15) * 248320 * 4 + 15 * 4
    # auto verifies 1 token, 2-4 (the MTP layer 1-3 deep, lookup's shortest), 8 or 16; each row's features:
    # the drafter's 5 taps and the last layer's output the MTP layer reads
    assert pair.target_shape.mtp
    assert state.step_outputs == (1 + 2 + 3 + 4 + 8 + 16) * (248320 * 4 + 6 * 5120 * 2)


def test_the_shape_of_an_engine_config_tells_dflash2_by_its_architecture():
    from dflash_chat.bench import synthetic_models
    from dflash_chat.engine.models.config import DrafterConfig

    raw = synthetic_models.DRAFTERS["qwen3.8-27b"]  # z-lab/Qwen3.8-27B-DFlash2's config
    assert memory.DrafterShape.of(DrafterConfig.from_dict(raw)) == DFLASH2
    plain = memory.DrafterShape.of(DrafterConfig.from_dict(dict(raw, architectures=["DFlashDraftModel"])))
    assert (plain.kind, plain.selector_top_k, plain.sliding_layers) == ("dflash", 0, 5)


def test_a_shape_the_memory_model_cannot_size_says_why():
    assert DFLASH2.problem() is None
    assert (
        "needs selector_rank"
        in memory.DrafterShape(
            5, 8, 128, 5120, kind="dflash2", selector_top_k=16, conv_kernel=2, conv_group=16
        ).problem()
    )
    assert "known kinds: dflash, dflash2" in memory.DrafterShape(5, 8, 128, 5120, kind="eagle").problem()
    assert "belong to kind" in memory.DrafterShape(5, 8, 128, 5120, selector_top_k=16).problem()


# --- overrides --------------------------------------------------------------------------------------


def test_model_and_quant_overrides(catalog):
    big = machine(80)
    assert choose(big, catalog, model="qwen3.5-9b").target.quant == "Q8_0"
    pinned = choose(big, catalog, quant="Q4_K_M", drafter_quant="Q4_K_M", context=8192)
    assert (pinned.pair.name, pinned.target.quant, pinned.drafter.quant) == ("qwen3.8-27b", "Q4_K_M", "Q4_K_M")
    assert choose(big, catalog, model="qwen3.8-27b", drafter_quant="BF16").drafter.repo == "z-lab/Qwen3.8-27B-DFlash2"
    assert choose(big, catalog, model="Qwen3.6-35B-A3B").pair.name == "qwen3.6-35b-a3b"


def test_a_drafter_quant_alone_skips_the_pairs_without_it(catalog):
    # the 27Bs and 35B-A3B publish a Q8_0 drafter, 9B and 4B only BF16
    choice = choose(machine(24), catalog, drafter_quant="Q8_0", context=8192)
    assert (choice.pair.name, choice.drafter.quant) == ("qwen3.8-27b", "Q8_0")
    with pytest.raises(NoFitError, match="the smallest option, Qwen3.8-27B Q3_K_S \\+ DFlash2 drafter Q8_0 with"):
        choose(machine(16), catalog, drafter_quant="Q8_0", context=8192)
    with pytest.raises(UserError, match="no model has drafter quant Q2_K"):
        choose(machine(80), catalog, drafter_quant="Q2_K")
    with pytest.raises(UserError, match="Qwen3.5-9B has no drafter quant Q8_0"):
        choose(machine(80), catalog, model="qwen3.5-9b", drafter_quant="Q8_0")


def test_a_pinned_choice_that_does_not_fit_is_returned_with_a_warning(catalog):
    choice = choose(machine(8), catalog, model="qwen3.6-27b", quant="Q8_0", drafter_quant="Q8_0")
    assert not choice.fits
    assert "will not fit" in choice.explanation and choice.explanation.startswith("RTX 4060 8 GiB: Qwen3.6-27B Q8_0")


def test_allow_no_fit_returns_the_smallest_option(catalog):
    with pytest.raises(NoFitError):
        choose(machine(8), catalog, model="qwen3.6-27b")
    choice = choose(machine(8), catalog, model="qwen3.6-27b", allow_no_fit=True)
    # the smallest: its 3-bit quant alone (it drafts with its own MTP layer)
    assert (choice.target.quant, choice.drafter) == ("Q3_K_M", None) and not choice.fits
    pair = catalog.get("qwen3.6-27b")
    assert choice.budget.need == min(
        budget(pair, t, d, choice.context, machine(8)).need for t in pair.targets for d in (*pair.drafters, None)
    )
    assert choose(machine(80), catalog, model="qwen3.6-27b", allow_no_fit=True).fits  # the best when one fits


def test_context_longer_than_the_model_allows(catalog):
    with pytest.raises(UserError, match="supports at most 262144 tokens"):
        choose(machine(80), catalog, model="qwen3.6-27b", context=300_000)
    with pytest.raises(UserError, match="at least 256"):
        choose(machine(80), catalog, context=100)


def test_target_file_is_matched_to_its_pair_by_name(catalog, tmp_path):
    gguf = tmp_path / "Qwen3.6-27B-Q5_K_M.gguf"
    with gguf.open("wb") as handle:
        handle.truncate(20 * 10**9)  # sparse: the picker only needs its size
    choice = choose(machine(80), catalog, target_file=gguf)
    assert choice.pair.name == "qwen3.6-27b" and choice.target.path == gguf
    assert choice.budget.target == 20 * 10**9
    assert "Qwen3.6-27B-Q5_K_M.gguf (local file) + drafter Q8_0" in choice.explanation

    mystery = tmp_path / "model.gguf"
    mystery.write_bytes(b"GGUF")
    with pytest.raises(UserError, match="add --model NAME"):
        choose(machine(80), catalog, target_file=mystery)
    with pytest.raises(UserError, match="no such file"):
        choose(machine(80), catalog, target_file=tmp_path / "absent.gguf")


def test_a_drafter_file_alone_picks_the_pair_it_belongs_to(catalog, tmp_path):
    drafter = tmp_path / "Qwen3.6-27B-DFlash-q8_0.gguf"
    with drafter.open("wb") as handle:
        handle.truncate(2 * 10**9)
    choice = choose(machine(80), catalog, drafter_file=drafter)
    assert choice.pair.name == "qwen3.6-27b" and choice.drafter.path == drafter
    assert choice.drafter.shape == catalog.get("qwen3.6-27b").drafter("Q8_0").shape  # sized as the pair's drafter
    other = tmp_path / "Qwen3.6-35B-A3B-DFlash.gguf"  # two trainings: sized as the larger cache
    with other.open("wb") as handle:
        handle.truncate(10**9)
    assert choose(machine(80), catalog, drafter_file=other).drafter.shape.layers == 8
    # too small for the 27B: the error says so, never a smaller target beside the 27B's drafter
    with pytest.raises(NoFitError, match="Qwen3.6-27B"):
        choose(machine(8), catalog, drafter_file=drafter)

    mystery = tmp_path / "drafter.gguf"
    mystery.write_bytes(b"GGUF")
    with pytest.raises(UserError, match="add --model NAME"):
        choose(machine(80), catalog, drafter_file=mystery)
    with pytest.raises(UserError, match="--drafter-file .*no such file"):
        choose(machine(80), catalog, drafter_file=tmp_path / "absent.gguf")


# --- probe --------------------------------------------------------------------------------------------


def test_importing_hardware_does_not_import_torch():
    modules = "dflash_chat.models.hardware, dflash_chat.models.hub, dflash_chat.ui.download_screen"
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_probe_reads_gpus_from_torch_cuda(monkeypatch):
    import torch

    cards = {0: ("NVIDIA GeForce RTX 3090", 20 * GIB, 24 * GIB), 1: ("NVIDIA RTX A6000", 45 * GIB, 48 * GIB)}
    fake = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 2,
        mem_get_info=lambda i: cards[i][1:],
        get_device_name=lambda i: cards[i][0],
    )
    monkeypatch.setattr(torch, "cuda", fake)
    m = hardware.probe()
    assert [g.name for g in m.gpus] == ["NVIDIA GeForce RTX 3090", "NVIDIA RTX A6000"]
    assert m.gpu.index == 1 and m.device == "cuda:1" and m.gpu.label == "RTX A6000 48 GiB"
    assert m.ram_total > 0


def test_probe_without_cuda_is_a_cpu_machine():
    m = hardware.probe()
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert m.gpus == () and m.device == "cpu" and m.cuda_note
    assert 0 < m.ram_available <= m.ram_total


def test_where_no_drafter_fits_the_pick_is_the_target_alone_with_its_mtp_layer(catalog):
    """16 GB at 8k: Qwen3.8-27B Q3_K_M fits, but no DFlash2 drafter beside it; it runs alone and drafts with its
    own MTP layer and prompt lookup, and says so (the same words in `models` and `doctor`)."""
    choice = choose(machine(16), catalog, context=8192)
    assert (choice.pair.name, choice.target.quant, choice.drafter) == ("qwen3.8-27b", "Q3_K_M", None)
    assert choice.methods == ("mtp", "lookup")
    assert "Qwen3.8-27B Q3_K_M alone, drafting with its own MTP layer (no drafter fits beside it)" in (
        choice.explanation
    )
    assert choice.drafting.startswith("drafts with the target's own MTP layer and prompt lookup")
    assert "none fits beside this quant" in choice.drafting
    pair = choice.pair
    assert not any(budget(pair, choice.target, d, 8192, machine(16)).fits for d in pair.drafters)
    # where a drafter fits, it is the pick, and the MTP layer and lookup come with it
    roomy = choose(machine(24), catalog, context=8192)
    assert roomy.drafter is not None and roomy.methods == ("dflash2", "mtp", "lookup")
    assert "the drafter fits beside this quant" in roomy.drafting


def test_the_moe_target_drafts_with_its_mtp_layer_first(catalog):
    """Qwen3.6-35B-A3B (mtp_first): the target alone, even where its drafter fits; a drafter quant asked for
    is still honoured."""
    choice = choose(machine(32), catalog, model="qwen3.6-35b-a3b", context=8192)
    assert choice.drafter is None and choice.fits and choice.methods == ("mtp", "lookup")
    assert "(MoE: its MTP layer drafts faster than a DFlash drafter here)" in choice.explanation
    assert "MoE target" in choice.drafting
    assert budget(choice.pair, choice.target, choice.pair.drafters[0], 8192, machine(32)).fits
    asked = choose(machine(32), catalog, model="qwen3.6-35b-a3b", drafter_quant="Q8_0", context=8192)
    assert asked.drafter is not None and asked.methods == ("dflash", "mtp", "lookup")


def test_a_pair_without_an_mtp_layer_never_runs_alone(catalog):
    choice = choose(machine(12), catalog, context=8192)
    assert choice.pair.name == "qwen3.5-9b" and not choice.pair.has_mtp
    assert choice.drafter is not None and choice.methods == ("dflash", "lookup")
    assert "carry no MTP layer" in choice.drafting
