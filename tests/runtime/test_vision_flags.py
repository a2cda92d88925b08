"""`--vision` and `--mmproj FILE` are checked before anything loads, each problem one line; a good mmproj reaches
the loader, and the loader is told when to load no tower."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_chat.cli import main
from dflash_chat.errors import UserError
from dflash_chat.runtime.model_source import ModelSource, Pick, resolve, vision_to_load
from dflash_chat.settings import Settings
from tests.runtime.test_loader import _mmproj

MISSING = "/no/such/model"  # were anything loaded, the error would be about this path


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "app"))
    return tmp_path


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory):
    return _mmproj(tmp_path_factory.mktemp("tower") / "mmproj-F16.gguf", 32)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def other_gguf(path, arch: str, projector: str | None = None):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    if projector:
        writer.add_clip_projector_type(projector)
    writer.add_tensor("v.patch_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "argv, command",
    [
        (["--vision", "on"], "dflash-chat"),
        (["serve", "--target", MISSING, "--vision", "maybe"], "dflash-chat serve"),
        (["models", "--vision", "yes"], "dflash-chat models"),
        (["pull", "qwen3.6-27b", "--vision", "1"], "dflash-chat pull"),
    ],
)
def test_vision_is_checked_like_the_setting(capsys, argv, command):
    assert main(argv) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"{command}: argument --vision: must be auto (the vision tower loads where it fits beside")
    assert err.endswith(f"or off, got {argv[-1]!r} (see `{command} --help`)")


def test_bad_mmproj_files_are_one_line_before_anything_loads(capsys, tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    target = other_gguf(tmp_path / "Qwen3.6-27B-Q4_K_M.gguf", "qwen35")
    gemma = other_gguf(tmp_path / "mmproj-gemma.gguf", "clip", "gemma3")
    cases = [
        (tmp_path / "absent.gguf", "no such file; give the mmproj-*.gguf file"),
        (folder, "a folder; give the mmproj-*.gguf file"),
        (text, "not a GGUF file (wrong magic b'not '). Use a llama.cpp .gguf file."),
        (target, "is not an mmproj file (architecture 'qwen35', not 'clip'): pass the mmproj-*.gguf"),
        (gemma, "holds a 'gemma3' vision projector; dflash-chat runs Qwen3.5/3.6's ('qwen3vl_merger')"),
    ]
    for command in ([], ["serve"]):
        for path, words in cases:
            assert main([*command, "--target", MISSING, "--mmproj", str(path)]) == 2
            err = one_line_error(capsys)
            assert err.startswith(f"dflash-chat: --mmproj {path}") and words in err


def test_mmproj_needs_a_target_and_vision_on(capsys, mmproj):
    for argv in (["--mmproj", str(mmproj)], ["--demo", "--mmproj", str(mmproj)]):
        assert main(argv) == 2
        assert one_line_error(capsys) == (
            "dflash-chat: --mmproj is the vision tower of a target GGUF you point at: give --target or --target-file"
        )
    assert main(["--target", MISSING, "--mmproj", str(mmproj), "--vision", "off"]) == 2
    assert one_line_error(capsys) == (
        f"dflash-chat: --mmproj {mmproj} gives a vision tower, and the vision setting is off: add --vision auto"
    )
    assert main(["--endpoint", "http://127.0.0.1:9/v1", "--mmproj", str(mmproj)]) == 2
    assert one_line_error(capsys) == "dflash-chat: --endpoint chats with a server's model: leave out --mmproj"


def test_a_good_mmproj_goes_with_the_files_to_the_loader(mmproj, tmp_path):
    source = resolve(Settings(), target=MISSING, pick=Pick(mmproj_file=str(mmproj)))
    assert isinstance(source, ModelSource) and source.vision == str(mmproj)
    assert vision_to_load(source, "auto") == str(mmproj)
    target = tmp_path / "Qwen3.6-27B-Q4_K_M.gguf"
    target.write_bytes(b"GGUF")
    pick = resolve(Settings(), pick=Pick(target_file=str(target), mmproj_file=str(mmproj)))
    assert isinstance(pick, Pick) and pick.mmproj_file == str(mmproj) and pick.target_file == str(target)
    # the `model` setting naming a file takes the tower as --target would
    saved = resolve(Settings(model=str(target)), pick=Pick(mmproj_file=str(mmproj)))
    assert saved == ModelSource(str(target), None, vision=str(mmproj))
    with pytest.raises(UserError, match="give --target or --target-file"):
        resolve(Settings(model="qwen3.6-27b"), pick=Pick(mmproj_file=str(mmproj)))  # a pair: its own tower


def test_what_the_loader_is_told_to_do_with_the_tower(tmp_path):
    """A path where one was chosen or given; False (none) under `vision = off` or where the model manager left it
    out; None for files loaded as they are, whose folder's own tower then loads (tests/engine/test_vision.py)."""
    folder = str(tmp_path / "vlm")
    assert vision_to_load(ModelSource(folder, None), "auto") is None
    assert vision_to_load(ModelSource(folder, None), "off") is False
    assert vision_to_load(ModelSource(folder, None, vision="/m/mmproj.gguf"), "off") is False
    assert vision_to_load(ModelSource(folder, None, vision_chosen=True), "auto") is False
    assert vision_to_load(ModelSource(folder, None, vision=folder, vision_chosen=True), "auto") == folder


def test_the_mmproj_check_reads_only_the_header_without_torch(mmproj):
    import subprocess
    import sys

    code = (
        "import sys; from dflash_chat.runtime.model_source import check_mmproj; "
        f"check_mmproj({str(mmproj)!r}, 'auto'); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_demo_loads_its_own_tower_unless_vision_is_off():
    from dflash_chat.models.demo import demo_available, demo_vision

    if not demo_available() or demo_vision() is None:
        pytest.skip("the demo pair and its vision tower are not in demo_data")
    source = resolve(Settings(), demo=True)
    assert isinstance(source, ModelSource) and source.demo and source.vision == str(demo_vision())
    assert vision_to_load(source, "auto") == str(demo_vision())
    assert vision_to_load(source, "off") is False
