"""The vision tower in the catalog and the pick: every shipped pair names its tower (shape and mmproj file), the
memory model sizes it, the pick loads it exactly where it fits beside what it chose without ever changing that
choice, and says why in one line; `vision = off` and `--mmproj FILE` are honoured."""

from __future__ import annotations

import pytest

from dflash_chat.engine import memory
from dflash_chat.models.catalog import COMMIT, CatalogError, load_catalog
from dflash_chat.models.hardware import NoFitError, choose
from dflash_chat.models.sizes import size_text
from tests.models.test_hardware import TABLE, machine


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    return load_catalog(tmp_path_factory.mktemp("cfg") / "config.toml")


def test_every_shipped_pair_names_its_tower_and_its_mmproj_file(catalog):
    for pair in catalog.pairs:
        assert pair.vision is not None and pair.mmproj is not None, pair.name
        assert pair.vision.out_hidden == pair.target_shape.hidden  # the merger writes the text model's width
        assert (pair.vision.depth, pair.vision.hidden, pair.vision.heads) == (27, 1152, 16)
        source = pair.mmproj
        assert source.kind == "mmproj" and source.repo == pair.target_repo and COMMIT.match(source.revision)
        assert source.revision == next(t.revision for t in pair.targets if t.repo == pair.target_repo)
        # the catalog's size_gb is the tower's F16 bytes: its parameters at 2 bytes, within 1 %
        assert source.size == pytest.approx(memory.vision_weight_bytes(pair.vision, 2), rel=0.01)
        for target in pair.targets:
            assert pair.vision_source(target) is source  # GGUF targets: the mmproj beside them


@pytest.mark.parametrize(("size", "context"), sorted(k for k, v in TABLE.items() if v is not None))
def test_the_tower_loads_exactly_where_it_fits_and_never_changes_the_pick(catalog, size, context):
    m = machine(size)
    choice = choose(m, catalog, context=context)
    off = choose(m, catalog, context=context, vision="off")
    assert (choice.pair, choice.target, choice.drafter, choice.budget) == (
        off.pair,
        off.target,
        off.drafter,
        off.budget,
    )
    assert choice.explanation == off.explanation
    assert not off.vision.loads and off.vision.line == "Vision: off (the vision setting); images are refused"
    b = choice.budget
    need = memory.vision_bytes(choice.pair.vision, b.workspace, m.compute_bytes)
    left = b.available - b.need
    assert choice.vision.loads == (need <= left)
    line = choice.vision.line
    assert "\n" not in line
    if choice.vision.loads:
        assert choice.vision.need == need and choice.vision.source is choice.pair.mmproj
        weights = memory.vision_weight_bytes(choice.pair.vision, m.compute_bytes)
        assert line == (
            f"Vision: loaded ({size_text(weights)} of weights + {size_text(need - weights)} while it reads a "
            f"16-megapixel image; {size_text(left - need)} to spare)"
        )
    else:
        assert choice.vision.need == 0 and choice.vision.source is None
        assert line.startswith(f"Vision: not loaded: the tower needs {size_text(need)} and {size_text(left)} is left")
        assert "a shorter --context or a smaller quant makes room" in line


def test_where_it_loads_on_common_cards(catalog):
    """The tower costs ~0.9 GB of weights and ~1-2 GB more while it reads a 16-megapixel image: it comes with the
    pick on 48 and 80 GB cards at every context, on 32 GB at 32k, and not beside a 24 GB card's 32k pick."""
    loads = {
        (size, context): choose(machine(size), catalog, context=context).vision.loads
        for size in (24, 32, 48, 80)
        for context in (8192, 32768, 131072)
    }
    assert all(loads[size, context] for size in (48, 80) for context in (8192, 32768, 131072))
    assert loads[32, 32768] and not loads[24, 32768]


def test_the_tower_is_counted_in_the_compute_dtype(catalog):
    """On the CPU the tower is float32: twice its bf16 weights, whatever the mmproj file's type."""
    pair = catalog.get("qwen3.5-4b")
    assert memory.vision_weight_bytes(pair.vision, 4) == 2 * memory.vision_weight_bytes(pair.vision, 2)
    cpu = choose(machine(0), catalog, context=8192)
    b = cpu.budget
    need = memory.vision_bytes(pair.vision, b.workspace, 4)
    assert not cpu.vision.loads and size_text(need) in cpu.vision.why


def test_a_pick_that_does_not_fit_loads_no_tower(catalog):
    tight = choose(machine(8), catalog, model="qwen3.6-27b", quant="Q8_0", drafter_quant="Q8_0", context=8192)
    assert not tight.fits and not tight.vision.loads
    assert tight.vision.why.startswith("not loaded: the model itself does not fit")
    with pytest.raises(NoFitError):
        choose(machine(8), catalog, model="qwen3.6-27b", context=262144)


def test_an_mmproj_file_given_is_the_towers_source(catalog, tmp_path):
    target = tmp_path / "Qwen3.6-27B-Q4_K_M.gguf"
    with target.open("wb") as handle:
        handle.truncate(16 * 10**9)
    tower = tmp_path / "mmproj-Qwen3.6-27B-f16.gguf"
    tower.write_bytes(b"GGUF" + bytes(60))
    choice = choose(machine(80), catalog, target_file=target, mmproj_file=tower)
    assert choice.vision.loads and choice.vision.source.path == tower and choice.vision.source.kind == "mmproj"
    # without one, a local target of a known pair takes the pair's mmproj from its repo
    assert choose(machine(80), catalog, target_file=target).vision.source is catalog.get("qwen3.6-27b").mmproj


USER_PAIRS = """
[models.no-eyes]
title = "No eyes"
tokenizer = "me/tok"
[models.no-eyes.target]
repo = "me/no-eyes-GGUF"
shape = { layers = 4, attention_layers = 1, heads = 2, kv_heads = 1, head_dim = 16, rotary_dim = 4, hidden = 32, intermediate = 64, vocab = 256 }
quants.Q8_0 = { pattern = "*Q8_0*.gguf", size_gb = 0.001 }

[models.my-27b-folder]
extends = "qwen3.6-27b"
title = "Qwen3.6-27B (my BF16 folder)"
target = { quants = { BF16 = { repo = "Qwen/Qwen3.6-27B", revision = "main", format = "safetensors", size_gb = 55.6 } } }
"""


def test_a_pair_without_a_tower_and_a_safetensors_target_with_its_own(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(USER_PAIRS)
    catalog = load_catalog(config)
    plain = choose(machine(24), catalog, model="no-eyes", context=4096)
    assert not plain.vision.loads
    assert plain.vision.line == "Vision: not loaded: this model has no vision tower in the catalog"
    folder = choose(machine(80), catalog, model="my-27b-folder", quant="BF16", context=8192)
    assert folder.target.kind == "safetensors"
    assert folder.vision.loads and folder.vision.source is folder.target  # model.visual.* in its own files


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("vision = { depth = 27, hidden = 1152, intermediate = 4304, heads = 0, out_hidden = 32 }", "heads must be"),
        ("vision = { depth = 27, hidden = 1152, intermediate = 4304, heads = 7, out_hidden = 32 }", "not a multiple"),
        ("vision = { depth = 27, hidden = 1152, heads = 16, out_hidden = 32 }", "needs `target.vision.intermediate`"),
        ("vision = { depth = 2, hidden = 8, intermediate = 8, heads = 2, out_hidden = 32, colour = 1 }", "colour"),
        ('mmproj = { pattern = "*mmproj*.gguf" }', "has `target.mmproj` but no `target.vision`"),
        ('mmproj = "mmproj.gguf"', "`target.mmproj` must be a table"),
        (
            "vision = { depth = 2, hidden = 8, intermediate = 8, heads = 2, out_hidden = 32 }\n"
            "mmproj = { size_gb = 1 }",
            "needs `target.mmproj.pattern`",
        ),
    ],
)
def test_bad_vision_entries_are_one_line_errors(tmp_path, entry, words):
    config = tmp_path / "config.toml"
    config.write_text(
        USER_PAIRS.replace(
            'quants.Q8_0 = { pattern = "*Q8_0*.gguf", size_gb = 0.001 }',
            f'quants.Q8_0 = {{ pattern = "*Q8_0*.gguf", size_gb = 0.001 }}\n{entry}',
        )
    )
    with pytest.raises(CatalogError) as exc:
        load_catalog(config)
    assert words in str(exc.value) and "\n" not in str(exc.value)
    assert str(exc.value).startswith(f"{config}: [models.no-eyes]")


def test_a_users_own_mmproj_path_in_config(tmp_path):
    tower = tmp_path / "mmproj-F16.gguf"
    tower.write_bytes(b"GGUF")
    config = tmp_path / "config.toml"
    config.write_text(f'[models."qwen3.6-27b".target]\nmmproj = {{ path = "{tower}" }}\n')
    pair = load_catalog(config).get("qwen3.6-27b")
    assert pair.mmproj.path == tower and pair.mmproj.kind == "mmproj" and pair.mmproj.repo is None
    assert choose(machine(80), load_catalog(config), model="qwen3.6-27b").vision.source.path == tower


def test_an_mmproj_for_a_pair_without_a_known_tower_is_sized_as_qwen35s(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(USER_PAIRS)
    tower = tmp_path / "mmproj.gguf"
    tower.write_bytes(b"GGUF")
    choice = choose(machine(24), load_catalog(config), model="no-eyes", context=4096, mmproj_file=tower)
    qwen35 = memory.VisionShape(27, 1152, 4304, 16, 32)
    assert choice.vision.loads and choice.vision.source.path == tower
    assert choice.vision.need == memory.vision_bytes(qwen35, choice.budget.workspace, 2)
