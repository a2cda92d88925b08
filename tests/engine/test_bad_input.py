"""Bad input gives one clear error that names the cause."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from dflash_chat.engine.errors import ContextLengthError, ModelFormatError
from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine


@pytest.fixture
def target_copy(tiny_dirs, tmp_path):
    src = tiny_dirs["qwen3_5"][0]
    dst = tmp_path / "target"
    shutil.copytree(src, dst)
    return dst


def _edit_config(directory, **changes):
    path = directory / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_unknown_architecture(target_copy):
    _edit_config(target_copy, model_type="llama4")
    with pytest.raises(ModelFormatError, match="unknown target architecture 'llama4'"):
        load_target(target_copy, "cpu")


def test_missing_weight_files(target_copy):
    (target_copy / "model.safetensors").unlink()
    with pytest.raises(ModelFormatError, match="no .safetensors weight files"):
        load_target(target_copy, "cpu")


def test_missing_shard_named_in_the_index(target_copy):
    (target_copy / "model.safetensors").rename(target_copy / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (target_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFormatError, match="model-00002-of-00002.safetensors missing"):
        load_target(target_copy, "cpu")


def test_missing_tensor(target_copy):
    tensors = load_file(str(target_copy / "model.safetensors"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(target_copy / "model.safetensors"))
    with pytest.raises(ModelFormatError, match="missing model.norm.weight"):
        load_target(target_copy, "cpu")


def test_shape_mismatch(target_copy):
    _edit_config(target_copy, intermediate_size=96)
    with pytest.raises(ModelFormatError, match=r"mlp\.(gate|up|down)_proj\.weight has shape"):
        load_target(target_copy, "cpu")


def test_truncated_weights(target_copy):
    path = target_copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ModelFormatError, match="corrupt or truncated"):
        load_target(target_copy, "cpu")


def test_missing_or_corrupt_config(target_copy, tmp_path):
    with pytest.raises(ModelFormatError, match="does not exist"):
        load_target(tmp_path / "nowhere", "cpu")
    (target_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        load_target(target_copy, "cpu")
    (target_copy / "config.json").unlink()
    with pytest.raises(ModelFormatError, match="has no config.json"):
        load_target(target_copy, "cpu")


def test_drafter_for_another_model(tiny_dirs, tmp_path):
    target = load_target(tiny_dirs["qwen3_5"][0], "cpu")
    drafter = tmp_path / "drafter"
    shutil.copytree(tiny_dirs["qwen3_5"][1], drafter)
    _edit_config(drafter, dflash_config={"block_size": 16, "mask_token_id": 5, "target_layer_ids": [1, 9]})
    with pytest.raises(ModelFormatError, match=r"taps target layers \[9\].*has 4 layers"):
        load_drafter(drafter, target)


def test_not_a_drafter(tiny_dirs):
    target = load_target(tiny_dirs["qwen3_5"][0], "cpu")
    with pytest.raises(ModelFormatError, match="not a DFlash drafter"):
        load_drafter(tiny_dirs["qwen3"][0], target)


def test_prompt_longer_than_the_context(tiny_dirs):
    engine = Engine(load_target(tiny_dirs["qwen3_5"][0], "cpu"), None, max_context=32)
    with pytest.raises(
        ContextLengthError, match=r"prompt \(30 tokens\) \+ max new tokens \(8\) exceed the 32-token context"
    ):
        list(engine.generate(list(range(30)), SamplingParams(max_new_tokens=8)))
    with pytest.raises(ValueError, match="empty"):
        list(engine.generate([], SamplingParams()))


def test_bad_sampling_parameters():
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "tokenizer.json"])
def test_a_folder_whose_json_is_broken_is_one_line_naming_the_file_and_position(target_copy, name):
    from dflash_chat.engine.load import load_pair
    from dflash_chat.errors import describe

    broken = target_copy / name
    broken.write_text('{"model_type": "qwen3_5",\n  "hidden_size": 64,,\n}')
    with pytest.raises(ModelFormatError, match=rf"{broken} is not valid JSON \(.*line 2 column 21.*\)") as exc:
        load_pair(target_copy, None, device="cpu")
    text = describe(exc.value)
    assert "\n" not in text and "Traceback" not in text
