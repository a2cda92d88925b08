"""Wrong files given to the loader: one ModelFormatError line that names the file and the cause."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.load import load_drafter, load_pair, load_target
from dflash_chat.errors import describe
from tests.engine.gguf_write import write_drafter_gguf, write_target_gguf
from tests.engine.tiny import write_drafter, write_target


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny qwen3 target (folder + GGUF) and a drafter for it (folder + GGUF)."""
    root = tmp_path_factory.mktemp("errors")
    hf = write_target(root / "target", "qwen3", seed=3)
    drafter_cfg = write_drafter(root / "drafter", root / "target", seed=4)
    state = load_file(str(root / "drafter" / "model.safetensors"))
    return {
        "root": root,
        "target": root / "target",
        "drafter": root / "drafter",
        "hf": hf,
        "drafter_state": state,
        "drafter_cfg": drafter_cfg,
        "target_gguf": write_target_gguf(root / "target.gguf", hf.state_dict(), hf.config.to_dict(), "Q8_0"),
        "drafter_gguf": write_drafter_gguf(root / "drafter.gguf", state, drafter_cfg, "Q8_0"),
    }


@pytest.fixture(scope="module")
def target(files):
    return load_target(files["target_gguf"], "cpu", torch.float32)


def _one_line(exc_info) -> str:
    text = describe(exc_info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.parametrize(
    "name, data, hint",
    [
        ("pytorch_model.bin", b"PK\x03\x04" + bytes(64), "PyTorch .bin checkpoints are not supported"),
        ("model.safetensors", b"\x10" + bytes(64), "pass the folder that holds it"),
        ("notes.txt", b"hello", "pass a llama.cpp .gguf file or a Hugging Face model folder"),
    ],
)
def test_a_file_that_is_neither_gguf_nor_a_folder(tmp_path, target, name, data, hint):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ModelFormatError, match=f"{path} is not a GGUF file or a model folder: {hint}") as exc:
        load_target(path, "cpu")
    _one_line(exc)
    with pytest.raises(ModelFormatError, match="is not a GGUF file or a model folder"):
        load_drafter(path, target)


def test_missing_paths(tmp_path, target):
    with pytest.raises(ModelFormatError, match=r"target .*nowhere\.gguf does not exist"):
        load_target(tmp_path / "nowhere.gguf", "cpu")
    with pytest.raises(ModelFormatError, match=r"drafter .*gone does not exist"):
        load_drafter(tmp_path / "gone", target)


def test_drafter_gguf_passed_as_the_target(files):
    with pytest.raises(
        ModelFormatError, match=r"drafter\.gguf is a DFlash drafter GGUF \(dflash-draft\), not a target"
    ):
        load_target(files["drafter_gguf"], "cpu")


def test_target_gguf_passed_as_the_drafter(files, target):
    with pytest.raises(ModelFormatError, match=r"target\.gguf is a qwen3 target model GGUF, not a DFlash drafter"):
        load_drafter(files["target_gguf"], target)


def test_gguf_drafter_tapping_layers_the_target_lacks(files, target, tmp_path):
    cfg = dict(files["drafter_cfg"], dflash_config={"block_size": 16, "mask_token_id": 5, "target_layer_ids": [1, 9]})
    path = write_drafter_gguf(tmp_path / "other.gguf", files["drafter_state"], cfg, "Q8_0", schema="dflash")
    with pytest.raises(
        ModelFormatError, match=rf"{path}: drafter taps target layers \[9\], but the target has 4 layers"
    ) as exc:
        load_drafter(path, target)
    _one_line(exc)


def test_gguf_drafter_for_a_wider_target(files, target, tmp_path):
    """A drafter made for a 128-wide target: its fc reads 2 x 128 features and its layers are 128 wide."""
    wide = write_target(tmp_path / "wide", "qwen3", seed=5, hidden=128)
    write_drafter(tmp_path / "wide-drafter", tmp_path / "wide", seed=6)
    cfg = json.loads((tmp_path / "wide-drafter" / "config.json").read_text())
    path = write_drafter_gguf(
        tmp_path / "wide.gguf", load_file(str(tmp_path / "wide-drafter" / "model.safetensors")), cfg, "Q8_0"
    )
    assert wide.config.hidden_size == 128
    with pytest.raises(
        ModelFormatError, match=rf"{path}: drafter expects 128-wide target features, the target's hidden size is 64"
    ):
        load_drafter(path, target)


def test_gguf_drafter_whose_sliding_pattern_is_shorter_than_its_layers(files, target, tmp_path):
    assert files["drafter_cfg"]["num_hidden_layers"] == 2
    cfg = dict(files["drafter_cfg"], layer_types=["sliding_attention"])  # the writer stores a 1-entry pattern
    path = write_drafter_gguf(tmp_path / "short.gguf", files["drafter_state"], cfg, "F32")
    with pytest.raises(ModelFormatError, match=rf"{path}: dflash-draft GGUF is missing hyperparameters") as exc:
        load_drafter(path, target)
    _one_line(exc)


def test_drafter_with_a_mask_token_outside_the_vocabulary(files, target, tmp_path):
    cfg = dict(
        files["drafter_cfg"], dflash_config={"block_size": 16, "mask_token_id": 248070, "target_layer_ids": [1, 2]}
    )
    path = write_drafter_gguf(tmp_path / "mask.gguf", files["drafter_state"], cfg, "F32")
    with pytest.raises(ModelFormatError, match=r"mask token id 248070 is outside the target's 384-token vocabulary"):
        load_drafter(path, target)


def test_folder_drafter_with_unknown_quantization(files, target):
    with pytest.raises(ModelFormatError, match="cannot quantize on load to 'Q2_K'"):
        load_drafter(files["drafter"], target, quant="Q2_K")


def test_folder_holding_several_ggufs(files, tmp_path):
    for name in ("a-Q4_K_M.gguf", "a-Q8_0.gguf"):
        (tmp_path / name).write_bytes(files["target_gguf"].read_bytes())
    with pytest.raises(
        ModelFormatError, match=r"holds several GGUF files \(a-Q4_K_M.gguf, a-Q8_0.gguf\): pass the one to load"
    ):
        load_target(tmp_path, "cpu")


def test_truncated_gguf_target(files, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(files["target_gguf"].read_bytes()[:-5000])
    with pytest.raises(ModelFormatError, match="truncated") as exc:
        load_target(path, "cpu")
    _one_line(exc)


def test_tokenizer_of_another_model(files, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(files["target"]))
    tok.add_tokens([f"<extra_{i}>" for i in range(500)])  # more tokens than the target's 384
    tok.save_pretrained(str(tmp_path / "tok"))
    with pytest.raises(ModelFormatError, match=r"the tokenizer has 884 tokens, the target's vocabulary only 384"):
        load_pair(files["target_gguf"], None, tokenizer=tmp_path / "tok", device="cpu")
    with pytest.raises(ModelFormatError, match=r"tokenizer folder .*nope does not exist"):
        load_pair(files["target_gguf"], None, tokenizer=tmp_path / "nope", device="cpu")


def test_gguf_without_tokenizer_metadata_and_no_tokenizer_folder(files, tmp_path):
    path = write_target_gguf(tmp_path / "bare.gguf", files["hf"].state_dict(), files["hf"].config.to_dict(), "F32")
    with pytest.raises(ModelFormatError, match=r"bare\.gguf: cannot build a tokenizer from the GGUF metadata"):
        load_pair(path, None, device="cpu")


def test_split_gguf_given_by_a_later_part_or_missing_one(files, tmp_path):
    hf = files["hf"]
    first = write_target_gguf(tmp_path / "m.gguf", hf.state_dict(), hf.config.to_dict(), "F32", split_max_tensors=20)
    second = first.with_name("m-00002-of-00003.gguf")
    first_part = (
        r"m-00002-of-00003\.gguf is part of a 3-part split GGUF: pass its first part \(m-00001-of-00003\.gguf\)"
    )
    with pytest.raises(ModelFormatError, match=first_part):
        load_target(second, "cpu")
    first.with_name("m-00003-of-00003.gguf").unlink()
    with pytest.raises(ModelFormatError, match=r"part m-00003-of-00003\.gguf of this split GGUF is missing"):
        load_target(first, "cpu")


def _patch_tensor_record(src, dst, name: str, *, dims=None, offset=None):
    """A copy of `src` whose tensor record `name` states other dims (same count) or another data offset."""
    import gguf
    import numpy as np

    t = next(t for t in gguf.GGUFReader(src).tensors if t.name == name)
    at = t.field.offset + 8 + len(name.encode()) + 4  # past the name and the dim count
    data = bytearray(src.read_bytes())
    if dims is not None:
        data[at : at + 8 * len(dims)] = np.array(dims, dtype=np.uint64).tobytes()
    if offset is not None:
        at += 8 * len(t.shape) + 4  # past the dims and the type
        data[at : at + 8] = np.array([offset], dtype=np.uint64).tobytes()
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"dims": [64, 0]}, r"has a zero dimension \(ne \[64, 0\]\)"),
        ({"dims": [2**64 - 64, 64]}, r"has a negative dimension \(ne \[-64, 64\]\)"),
        ({"dims": [48, 64]}, r"has rows of 48 values, not whole Q8_0 blocks of 32"),
        ({"dims": [64, 2**40]}, r"ends past the end of the file"),
        ({"offset": 10**9}, r"ends past the end of the file"),
    ],
)
def test_inconsistent_tensor_metadata_is_a_one_line_corrupt_file_error(files, tmp_path, change, problem):
    path = _patch_tensor_record(files["target_gguf"], tmp_path / "bad.gguf", "blk.0.attn_q.weight", **change)
    with pytest.raises(
        ModelFormatError, match=rf"bad\.gguf: corrupt GGUF: tensor blk\.0\.attn_q\.weight {problem}"
    ) as exc:
        load_target(path, "cpu")
    _one_line(exc)


# --- sizes in the metadata: checked against the weights (and bounded) before anything is built ---------------


def _copy_folder(src, dst, **config_changes):
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config_changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("layers", [1_000_000, 10**15])
def test_a_config_claiming_a_million_layers_is_refused_at_once(files, tmp_path, layers):
    import resource
    import time

    folder = _copy_folder(files["target"], tmp_path / "huge", num_hidden_layers=layers)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    with pytest.raises(ModelFormatError, match=f"num_hidden_layers = {layers}, expected a whole number") as exc:
        load_target(folder, "cpu")
    assert time.perf_counter() - started < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing was built
    _one_line(exc)


def test_a_config_whose_layer_count_the_weights_do_not_hold(files, tmp_path):
    folder = _copy_folder(files["target"], tmp_path / "more", num_hidden_layers=7)
    with pytest.raises(
        ModelFormatError, match=r"target config says 7 layers, its weights hold 4 \(layers 0-3\)"
    ) as exc:
        load_target(folder, "cpu")
    _one_line(exc)
    drafter = _copy_folder(files["drafter"], tmp_path / "drafter-more", num_hidden_layers=5)
    with pytest.raises(ModelFormatError, match="drafter config says 5 layers, its weights hold 2"):
        load_drafter(drafter, load_target(files["target"], "cpu", torch.float32))


@pytest.mark.parametrize(
    "field, value",
    [
        ("hidden_size", "256"),
        ("num_attention_heads", 0),
        ("vocab_size", -3),
        ("intermediate_size", 2.5),
        ("max_position_embeddings", 10**12),
        ("num_key_value_heads", True),
    ],
)
def test_a_size_that_is_not_a_sane_whole_number(files, tmp_path, field, value):
    folder = _copy_folder(files["target"], tmp_path / "bad", **{field: value})
    with pytest.raises(ModelFormatError, match=f"{field} = {value!r}, expected a whole number") as exc:
        load_target(folder, "cpu")
    _one_line(exc)


def test_a_gguf_claiming_a_million_blocks_is_refused(files, tmp_path):
    """The fixture's converter-written file with only its block count changed."""
    import gguf

    src = gguf.GGUFReader(str(files["target_gguf"]))
    arch = src.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(tmp_path / "huge.gguf"), arch)
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", f"{arch}.block_count"):
            continue
        writer.add_key_value(
            key, field.contents(), field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None
        )
    writer.add_block_count(1_000_000)
    for t in src.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFormatError, match="block_count is 1000000, expected 1 to 1024") as exc:
        load_target(tmp_path / "huge.gguf", "cpu")
    _one_line(exc)


def test_a_gguf_drafter_converted_with_another_models_vocabulary_is_refused(files, tmp_path):
    """llama.cpp's converter copies the target's vocabulary into the drafter GGUF: one made beside another
    model's tokenizer is refused before any weights load; the right one loads."""
    from transformers import AutoTokenizer

    from dflash_chat.models.demo import demo_dir

    own = AutoTokenizer.from_pretrained(str(files["target"]))
    other = AutoTokenizer.from_pretrained(str(demo_dir() / "target"))
    cfg, state = files["drafter_cfg"], files["drafter_state"]
    right = write_drafter_gguf(tmp_path / "right.gguf", state, cfg, "F32", schema="dflash", tokenizer=own)
    wrong = write_drafter_gguf(tmp_path / "wrong.gguf", state, cfg, "F32", schema="dflash", tokenizer=other)
    with pytest.raises(ModelFormatError, match="the drafter's vocabulary is not the target's tokenizer's") as exc:
        load_pair(files["target"], wrong, device="cpu", dtype=torch.float32, draft="off")
    _one_line(exc)
    assert load_pair(files["target"], right, device="cpu", dtype=torch.float32, draft="off").engine.drafter is not None
