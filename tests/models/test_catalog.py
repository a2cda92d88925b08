"""The shipped catalog and the user's own pairs in config.toml."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_chat.models.catalog import (
    BITS_PER_WEIGHT,
    COMMIT,
    CatalogError,
    _pair,
    load_catalog,
    matches,
    quant_of,
    split_group,
)


@pytest.fixture
def config(tmp_path):
    return tmp_path / "config.toml"


def test_shipped_pairs_follow_the_design(config):
    catalog = load_catalog(config)
    names = [p.name for p in catalog.ranked()]
    assert names == ["qwen3.8-27b", "qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.5-9b", "qwen3.5-4b"]
    assert [p.name for p in catalog.pairs if p.cpu_default] == ["qwen3.5-4b"]

    big = catalog.get("qwen3.6-27b")
    assert big.target_quants == ("Q8_0", "Q4_K_M", "Q3_K_M")  # order of preference
    assert big.target("Q4_K_M").repo == "unsloth/Qwen3.6-27B-GGUF"
    assert big.drafter_quants[0] == "Q8_0" and big.drafter_quants[-1] == "Q4_K_M"
    assert big.drafter("Q8_0").repo == "spiritbuun/Qwen3.6-27B-DFlash-GGUF"
    assert big.drafter("BF16").kind == "safetensors" and big.drafter("BF16").repo == "z-lab/Qwen3.6-27B-DFlash"
    assert big.tokenizer.repo == "Qwen/Qwen3.6-27B" and "tokenizer_config.json" in big.tokenizer.patterns
    assert big.target_shape.attention_layers == 16 and big.target_shape.linear_layers == 48

    for pair in catalog.pairs:
        assert pair.tokenizer.repo.startswith("Qwen/"), pair.name  # drafter repos ship no tokenizer
        assert pair.drafters, pair.name
        assert all(s.size > 0 for s in pair.targets + pair.drafters), pair.name
        # a Q8_0 file is bigger than a Q4_K_M one
        assert pair.target("Q8_0").size > pair.target("Q4_K_M").size
        assert all(s.shape is not None for s in pair.drafters), pair.name  # every drafter file is sized
    assert {p.drafter("BF16").repo for p in catalog.pairs if p.name.startswith("qwen3.5")} == {
        "z-lab/Qwen3.5-4B-DFlash",
        "z-lab/Qwen3.5-9B-DFlash",
    }


UPLOADS = [
    "Qwen3.6-27B-Q8_0.gguf",
    "Qwen3.6-27B-Q4_K_M.gguf",
    "Qwen3.6-27B-Q3_K_M.gguf",
    "Qwen3.6-27B-UD-Q3_K_XL.gguf",
    "Qwen3.6-27B-Q4_K_S.gguf",
    "Qwen3.6-27B-UD-Q4_K_XL.gguf",
    "Qwen3.6-27B-Q6_K.gguf",
    "BF16/Qwen3.6-27B-BF16-00001-of-00002.gguf",
    "mmproj-F16.gguf",
    "Qwen3.6-27B-DFlash-q8_0.gguf",
    "Qwen3.6-27B-DFlash-q4_k_m.gguf",
]


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M", "Q3_K_M"])
def test_patterns_pick_their_quant_and_nothing_else(config, quant):
    pair = load_catalog(config).get("qwen3.6-27b")
    sources = [pair.target(quant)] + [s for s in pair.drafters if s.quant == quant]
    for source in sources:
        hits = [name for name in UPLOADS if matches(name, source.patterns[0])]
        assert hits and all(quant_of(h) == quant for h in hits), (source.patterns, hits)


# The files of unsloth/Qwen3.8-27B-GGUF at the pinned commit (fdd03b8b) and of the drafter GGUF repo.
UPLOADS_38 = [
    "Qwen3.8-27B-Q8_0.gguf",
    "Qwen3.8-27B-Q6_K.gguf",
    "Qwen3.8-27B-Q5_K_M.gguf",
    "Qwen3.8-27B-Q5_K_S.gguf",
    "Qwen3.8-27B-Q4_K_M.gguf",
    "Qwen3.8-27B-Q4_K_S.gguf",
    "Qwen3.8-27B-Q4_0.gguf",
    "Qwen3.8-27B-Q4_1.gguf",
    "Qwen3.8-27B-IQ4_NL.gguf",
    "Qwen3.8-27B-IQ4_XS.gguf",
    "Qwen3.8-27B-Q3_K_M.gguf",
    "Qwen3.8-27B-Q3_K_S.gguf",
    "Qwen3.8-27B-UD-Q8_K_XL.gguf",
    "Qwen3.8-27B-UD-Q6_K_XL.gguf",
    "Qwen3.8-27B-UD-Q5_K_XL.gguf",
    "Qwen3.8-27B-UD-Q4_K_XL.gguf",
    "Qwen3.8-27B-UD-Q3_K_XL.gguf",
    "Qwen3.8-27B-UD-IQ3_XXS.gguf",
    "Qwen3.8-27B-UD-Q2_K_XL.gguf",
    "Qwen3.8-27B-UD-IQ2_M.gguf",
    "Qwen3.8-27B-UD-IQ2_XXS.gguf",
    "mmproj-BF16.gguf",
    "mmproj-F16.gguf",
    "BF16/Qwen3.8-27B-BF16-00001-of-00002.gguf",
    "BF16/Qwen3.8-27B-BF16-00002-of-00002.gguf",
]
DRAFTER_UPLOADS_38 = [
    "Qwen3.8-27B-DFlash2-Q8_0.gguf",
    "Qwen3.8-27B-DFlash2-Q4_K_M.gguf",
    "Qwen3.8-27B-DFlash2-BF16.gguf",
]


def test_the_qwen38_27b_pair_with_its_dflash2_drafter(config):
    pair = load_catalog(config).get("Qwen3.8-27B")
    assert pair.name == "qwen3.8-27b" and pair.rank > load_catalog(config).get("qwen3.6-27b").rank
    assert pair.target_quants == ("Q8_0", "Q4_K_M", "Q3_K_M", "Q3_K_S")  # a 3-bit one for 16 GB cards
    assert {(s.repo, s.revision, s.kind) for s in pair.targets} == {
        ("unsloth/Qwen3.8-27B-GGUF", "fdd03b8bbd279c1694563650e79d85a2373d9934", "gguf")
    }
    # the files' bytes at that commit, to 10 MB
    assert [s.size for s in pair.targets] == [29_050_000_000, 17_110_000_000, 13_820_000_000, 12_570_000_000]
    assert (pair.tokenizer.repo, pair.tokenizer.revision) == (
        "Qwen/Qwen3.8-27B",
        "1d4bf0f2ff6012fd82039f2fa52739d0dd7c60c0",
    )
    # Qwen3.6-27B's shapes: 64 layers, 16 of them gated attention, 48 Gated DeltaNet
    shape = pair.target_shape
    assert shape == load_catalog(config).get("qwen3.6-27b").target_shape
    assert (shape.layers, shape.attention_layers, shape.linear_layers) == (64, 16, 48)
    assert (shape.hidden, shape.intermediate, shape.vocab) == (5120, 17408, 248320)

    assert pair.drafter_quants == ("Q8_0", "BF16", "Q4_K_M")
    q8, bf16, q4 = (pair.drafter(q) for q in pair.drafter_quants)
    assert {(s.repo, s.revision) for s in (q8, q4)} == {
        ("incoai/Qwen3.8-27B-DFlash2-GGUF", "51962825493a48b846b40126d35c799ac4093ad0")
    }
    assert (bf16.repo, bf16.revision, bf16.kind) == (
        "z-lab/Qwen3.8-27B-DFlash2",
        "50307d4c4cde6860d4eee73e2547cd786fe8e8a4",
        "safetensors",
    )
    assert (q8.size, bf16.size, q4.size) == (2_056_000_000, 3_850_000_000, 1_143_000_000)
    # DFlash2DraftModel: five sliding layers (window 2048), block 8, and the selector and convolution sizes
    d = q8.shape
    assert q8.shape == bf16.shape == q4.shape and d.kind == "dflash2" and d.problem() is None
    assert (d.layers, d.sliding_layers, d.sliding_window, d.kv_heads, d.head_dim, d.hidden) == (
        5,
        5,
        2048,
        8,
        128,
        5120,
    )
    assert (d.block_size, d.taps) == (8, 5)
    assert (d.selector_top_k, d.selector_rank, d.conv_kernel, d.conv_group, d.conv_groups) == (16, 256, 2, 16, 320)
    assert pair.local_drafter(Path("Qwen3.8-27B-DFlash2-Q6_K.gguf")).shape == d  # one training: its shape


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M", "Q3_K_M", "Q3_K_S"])
def test_the_qwen38_patterns_pick_their_quant_and_nothing_else(config, quant):
    pair = load_catalog(config).get("qwen3.8-27b")
    sources = [pair.target(quant)] + [s for s in pair.drafters if s.quant == quant]
    for source in sources:
        listing = DRAFTER_UPLOADS_38 if source.repo == "incoai/Qwen3.8-27B-DFlash2-GGUF" else UPLOADS_38
        hits = [name for name in listing if matches(name, source.patterns[0])]
        assert len(hits) == 1 and quant_of(hits[0]) == quant, (source.patterns, hits)


def test_quant_and_split_names():
    assert quant_of("Qwen3.6-27B-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"
    assert quant_of("Q8_0/Qwen3.6-27B-Q8_0-00001-of-00002.gguf") == "Q8_0"
    assert quant_of("dflash-draft-q4_k_m.gguf") == "Q4_K_M"
    assert quant_of("Qwen3.6-27B.IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("model.gguf") is None
    assert split_group("a/x-Q8_0-00002-of-00003.gguf") == split_group("a/x-Q8_0-00001-of-00003.gguf")


def test_an_unlisted_quant_is_found_by_pattern_and_sized_by_bits(config):
    pair = load_catalog(config).get("qwen3.6-27b")
    q6 = pair.target("q6_k")
    assert q6.repo == pair.target_repo and matches("Qwen3.6-27B-Q6_K.gguf", q6.patterns[0])
    q8 = pair.target("Q8_0").size
    assert q6.size == int(q8 * BITS_PER_WEIGHT["Q6_K"] / BITS_PER_WEIGHT["Q8_0"])
    assert pair.target("Q4_K_M").size < q6.size < q8


def test_unknown_names_list_what_exists(config):
    catalog = load_catalog(config)
    with pytest.raises(CatalogError, match=r"unknown model 'llama'; known models: qwen3.6-27b, .*qwen3.5-4b"):
        catalog.get("llama")
    with pytest.raises(CatalogError, match=r"Qwen3.5-9B has no drafter quant Q8_0 \(it has BF16\)"):
        catalog.get("qwen3.5-9b").drafter("Q8_0")


def test_user_pair_from_local_files_extends_a_shipped_one(config, tmp_path):
    target = tmp_path / "Qwen3.6-27B-Q5_K_M.gguf"
    target.write_bytes(b"x" * 1234)
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "model.safetensors").write_bytes(b"y" * 99)
    config.write_text(
        f"""
temperature = 0.2
[models.mine]
extends = "qwen3.6-27b"
title = "My 27B"
target = {{ path = "{target}" }}
drafter = {{ path = "{drafter}" }}
"""
    )
    catalog = load_catalog(config)
    mine = catalog.get("My 27B")
    shipped = catalog.get("qwen3.6-27b")
    assert mine.origin == str(config)
    assert [(s.path, s.quant, s.size, s.kind) for s in mine.targets] == [(target, "Q5_K_M", 1234, "gguf")]
    assert [(s.path, s.size, s.kind) for s in mine.drafters] == [(drafter, 99, "safetensors")]
    assert mine.target_shape == shipped.target_shape and mine.tokenizer == shipped.tokenizer
    assert shipped.target_quants == ("Q8_0", "Q4_K_M", "Q3_K_M")  # the shipped pair is untouched


def test_user_table_with_a_shipped_name_overlays_it(config):
    config.write_text(
        """
[models."qwen3.6-27b".target]
repo = "someone/Qwen3.6-27B-GGUF"
quants.Q5_K_M = { pattern = "*Q5_K_M*.gguf", size_gb = 19.3 }
"""
    )
    pair = load_catalog(config).get("qwen3.6-27b")
    assert pair.target_repo == "someone/Qwen3.6-27B-GGUF"
    assert pair.target_quants == ("Q8_0", "Q4_K_M", "Q3_K_M", "Q5_K_M")
    assert {s.repo for s in pair.targets} == {"someone/Qwen3.6-27B-GGUF"}
    assert {s.revision for s in pair.targets} == {"main"}  # the shipped pin was for unsloth's repo
    assert pair.target("Q5_K_M").size == 19_300_000_000
    assert pair.drafter("Q8_0").repo == "spiritbuun/Qwen3.6-27B-DFlash-GGUF"


def test_every_shipped_source_is_pinned_to_a_commit(config):
    for pair in load_catalog(config).pairs:
        for source in (*pair.targets, *pair.drafters, pair.tokenizer):
            assert COMMIT.match(source.revision), (pair.name, source.repo, source.revision)
        assert pair.target("Q6_K").revision == pair.targets[0].revision  # unlisted quants: the same listing


def test_an_unpinned_shipped_source_is_refused():
    table = {
        "tokenizer": "Qwen/Q",
        "target": {
            "repo": "a/b",
            "revision": "main",
            "quants": {"Q8_0": {"pattern": "*Q8_0*"}},
            "shape": {
                "layers": 1,
                "attention_layers": 1,
                "heads": 1,
                "kv_heads": 1,
                "head_dim": 8,
                "rotary_dim": 8,
                "hidden": 8,
                "intermediate": 8,
                "vocab": 8,
            },
        },
    }
    with pytest.raises(CatalogError, match="a/b must be pinned to a 40-hex commit, not 'main'"):
        _pair("x", table, "catalog")


def test_the_35b_drafter_sources_say_which_training_their_file_holds(config):
    """z-lab retrained the 35B-A3B drafter: the GGUFs quantize the April weights, the BF16 source is
    pinned to the June retrain, and each is sized by the shape of the weights it holds."""
    pair = load_catalog(config).get("qwen3.6-35b-a3b")
    versions = dict(pair.drafter_versions)
    assert set(versions) == {"2026-04", "2026-06"}
    assert versions["2026-04"].layers == 8 and versions["2026-04"].sliding_layers == 0
    assert (versions["2026-06"].layers, versions["2026-06"].sliding_layers, versions["2026-06"].sliding_window) == (
        6,
        5,
        4096,
    )
    assert versions["2026-06"].taps == 8 and versions["2026-04"].taps == 5
    for quant in ("Q8_0", "Q4_K_M"):
        source = pair.drafter(quant)
        assert source.repo == "starskyzheng/Qwen3.6-35B-DFlash-GGUF" and source.version == "2026-04"
        assert source.shape == versions["2026-04"]
    bf16 = pair.drafter("BF16")
    assert (bf16.repo, bf16.revision) == ("z-lab/Qwen3.6-35B-A3B-DFlash", "0ce151d016ba8f0f0454d160a81b52ad4588c924")
    assert bf16.version == "2026-06" and bf16.shape == versions["2026-06"]


def test_the_27b_drafter_slides_on_four_of_five_layers(config):
    shape = load_catalog(config).get("qwen3.6-27b").drafter("BF16").shape
    assert (shape.layers, shape.sliding_layers, shape.sliding_window, shape.kv_heads) == (5, 4, 2048, 8)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[models.x]\nextends = "qwen3.6-27b"\ntitel = "typo"\n', r"\[models.x\] has unknown key `titel`"),
        ('[models.x]\nextends = "nope"\n', r"\[models.x\] extends unknown model 'nope'; known models: qwen3.6-27b"),
        ("[models.x]\ntitle = 'no target'\n", r"\[models.x\] needs `target`"),
        (
            '[models.x]\ntokenizer = "Qwen/Q"\n[models.x.target]\nrepo = "a/b"\nquants.Q8_0 = { pattern = "*" }\n',
            r"\[models.x\] needs `target.shape`",
        ),
        ('[models.x]\nextends = "qwen3.6-27b"\nrank = "high"\n', r"`rank` must be a whole number, got 'high'"),
        ("[models.x\n", r"is not valid TOML .*; fix or delete it"),
        ('[models.x]\nextends = "qwen3.6-27b"\ndrafter.shape = 3\n', r"`drafter.shape` must be dict, got 3"),
        (
            '[models.x]\nextends = "qwen3.6-35b-a3b"\n[models.x.drafter.quants]\nQ6_K = { pattern = "*q6_k*" }\n',
            r"needs `drafter.quants.Q6_K.version` \(one of: 2026-04, 2026-06\)",
        ),
        (
            '[models.x]\nextends = "qwen3.6-35b-a3b"\n[models.x.drafter.quants]\nQ6_K = { pattern = "*q6_k*", version = "v9" }\n',
            r"`drafter.quants.Q6_K.version` is 'v9'; the drafter's versions are: 2026-04, 2026-06",
        ),
        (
            '[models.x]\nextends = "qwen3.5-4b"\ndrafter.shape = { layers = 5, kv_heads = 8, head_dim = 128, hidden = 2560, kind = "eagle" }\n',
            r"`drafter.shape`: kind is 'eagle'; known kinds: dflash, dflash2",
        ),
        (
            '[models.x]\nextends = "qwen3.5-4b"\ndrafter.shape = { layers = 5, kv_heads = 8, head_dim = 128, hidden = 2560, kind = "dflash2", selector_top_k = 16 }\n',
            r"`drafter.shape`: a dflash2 drafter needs selector_rank, conv_kernel, conv_group",
        ),
        (
            '[models.x]\nextends = "qwen3.5-4b"\ndrafter.shape = { layers = 5, kv_heads = 8, head_dim = 128, hidden = 2560, kind = 2 }\n',
            r"`drafter.shape.kind` must be str, got 2",
        ),
        (
            '[models.x]\nextends = "qwen3.5-4b"\nmtp_first = true\n',
            r"has `mtp_first = true` but its target has no MTP layer: add `mtp = true` to `target.shape`",
        ),
        ('[models.x]\nextends = "qwen3.6-27b"\nmtp_first = 1\n', r"`mtp_first` must be bool, got 1"),
    ],
)
def test_config_mistakes_are_one_line_that_names_the_key(config, text, message):
    config.write_text(text)
    with pytest.raises(CatalogError, match=message) as err:
        load_catalog(config)
    assert str(config) in str(err.value) and "\n" not in str(err.value)
