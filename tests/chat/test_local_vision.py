"""The local backend's model rows say whether the vision tower is loaded (a real tiny pair and tower; the events
applied as the screen applies them), and a change of the vision setting loads the pair again without it."""

from __future__ import annotations

from dataclasses import replace

from dflash_chat.chat.backends.local import LocalBackend
from dflash_chat.runtime.model_source import ModelSource
from dflash_chat.settings import Settings
from tests.runtime.test_loader import _mmproj


def test_the_rows_say_the_tower_is_loaded_and_the_setting_takes_it_away(tmp_path):
    from tests.engine.tiny_vlm import write_vlm, write_vlm_tokenizer

    target = tmp_path / "vlm"  # a target whose tokenizer has the image tokens a tower needs
    write_vlm(target)
    write_vlm_tokenizer(target)
    tower = _mmproj(tmp_path / "mmproj-F16.gguf", 64)
    settings = Settings(context_length=256)
    backend = LocalBackend(settings, ModelSource(str(target), None, vision=str(tower), device="cpu"))
    backend.attach(lambda event: backend.handle(event), lambda body, group: body())
    backend.begin()
    names = [name for name, _ in backend.rows()]
    assert dict(backend.rows())["vision"] == "loaded" and names[names.index("device") + 1] == "vision"

    assert backend.apply_settings(replace(settings, vision="off"))  # loads again
    assert backend.pair is not None and backend.pair.vision is None
    assert "vision" not in dict(backend.rows())  # files loaded as they are: no pick to say it about

    # a pick of a pair with a tower that it left out: the setting's doing, or no room beside the model
    from dflash_chat.models.catalog import load_catalog
    from dflash_chat.models.hardware import GIB, Gpu, Machine
    from dflash_chat.runtime import model_manager
    from dflash_chat.runtime.model_source import Pick

    rtx_3090 = Machine((Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GIB, 23 * GIB),), 64 * GIB, 48 * GIB)
    catalog = load_catalog(tmp_path / "config.toml")
    tight = model_manager.choose(Pick(model="qwen3.6-27b"), 65536, machine=rtx_3090, catalog=catalog)
    assert not tight.choice.vision.loads
    backend.loader.chosen = tight
    assert dict(backend.rows())["vision"] == "off"  # the setting is off
    backend.loader.options = replace(backend.loader.options, vision="auto")
    assert dict(backend.rows())["vision"] == "no room"
