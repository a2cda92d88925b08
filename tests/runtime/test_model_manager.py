"""Which model the chat runs (flags, the `model` setting) and the model manager's steps without a UI.

The GPU probe is the only double (a Machine passed in); the Hub is tests/hubserver.py on loopback.
"""

from __future__ import annotations

import dataclasses

import pytest

from dflash_chat import cli, paths
from dflash_chat import settings as settings_module
from dflash_chat.errors import UserError
from dflash_chat.models import demo as demo_module
from dflash_chat.models import hub
from dflash_chat.models.catalog import CatalogError, load_catalog
from dflash_chat.models.hardware import GIB, Gpu, Machine, choose
from dflash_chat.runtime import model_manager, model_source
from dflash_chat.runtime.model_source import ModelSource, Pick, pick_from_args, resolve
from dflash_chat.settings import Settings
from tests.hubserver import HubServer, Repo, isolate_hub

REAL_DEMO_SOURCE = model_source.demo_source

RTX_3090 = Machine((Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GIB, 23 * GIB),), 64 * GIB, 48 * GIB)
NO_GPU = Machine((), 64 * GIB, 48 * GIB, "no CUDA device visible")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def args(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def source_of(*argv: str, settings: Settings | None = None):
    a = args(*argv)
    return resolve(settings or Settings(), target=a.target, drafter=a.drafter, demo=a.demo, pick=pick_from_args(a))


# --- flags and settings -> what to run ---------------------------------------------------------


def test_nothing_named_lets_the_manager_choose_for_the_settings_context(home):
    assert source_of() == Pick()
    assert source_of("--context", "16384") == Pick(context=16384)


def test_the_model_setting_is_a_catalog_name_or_a_path(home, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert source_of(settings=Settings(model="qwen3.6-27b")) == Pick(model="qwen3.6-27b")
    assert source_of(settings=Settings(model="Qwen3.6-35B-A3B")) == Pick(model="qwen3.6-35b-a3b")  # a title
    assert source_of(settings=Settings(model=str(folder), drafter="/d")) == ModelSource(str(folder), "/d")
    # written like a path: a path, even before it exists (the loader then says it is missing)
    assert source_of(settings=Settings(model="~/models/x.gguf")) == ModelSource("~/models/x.gguf", None)
    with pytest.raises(CatalogError) as err:
        source_of(settings=Settings(model="qwen9-huge"))
    known = ", ".join(p.name for p in load_catalog().pairs)
    assert str(err.value) == f"unknown model 'qwen9-huge'; known models: {known} (see `dflash-chat models`)"


def test_a_folder_in_the_working_directory_named_like_a_pair_is_a_folder(home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qwen3.6-27b").mkdir()
    assert source_of(settings=Settings(model="qwen3.6-27b")) == ModelSource("qwen3.6-27b", None)


def test_choice_flags_pin_the_pick_and_refine_a_named_setting(home, tmp_path):
    gguf = tmp_path / "Qwen3.6-27B-Q5_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    assert source_of("--model", "Qwen3.6-27B", "--quant", "Q8_0") == Pick(model="qwen3.6-27b", quant="Q8_0")
    assert source_of("--quant", "Q8_0", settings=Settings(model="qwen3.5-9b")) == Pick(model="qwen3.5-9b", quant="Q8_0")
    assert source_of("--model", "qwen3.5-4b", settings=Settings(model="qwen3.5-9b")) == Pick(model="qwen3.5-4b")
    assert source_of("--target-file", str(gguf)) == Pick(target_file=str(gguf))
    assert source_of("--target", "/t", "--context", "2048") == ModelSource("/t", None, context=2048)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "nope"], "unknown model 'nope'; known models: "),
        (["--target", "/t", "--quant", "Q8_0"], "--target/--drafter load those files as they are"),
        (["--demo", "--model", "qwen3.5-4b"], "--demo runs the built-in demo pair"),
        (["--target-file", "/no/such.gguf"], "--target-file /no/such.gguf: no such file or folder"),
        (["--drafter", "/d"], "--drafter needs --target too"),
    ],
)
def test_conflicting_or_unknown_choices_are_one_line_errors(home, capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dflash-chat: {message}") and len(err.splitlines()) == 1


def test_set_model_takes_a_pair_name_or_a_path(home, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--set", "model=Qwen3.6-27B"]) == 0
    assert settings_module.load().model == "qwen3.6-27b"
    (tmp_path / "mine").mkdir()
    assert cli.main(["--set", "model=mine"]) == 0
    assert settings_module.load().model == str(tmp_path / "mine")
    before = paths.config_file().read_bytes()
    capsys.readouterr()
    assert cli.main(["--set", "model=qwen9-huge"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'qwen9-huge'; known models: qwen3.6-27b" in err and len(err.strip().splitlines()) == 1
    assert paths.config_file().read_bytes() == before
    assert cli.main(["--set", "model="]) == 0 and settings_module.load().model == ""


# --- choosing ----------------------------------------------------------------------------------


def test_on_a_gpu_the_choice_is_the_pickers_for_the_settings_context(home):
    catalog = load_catalog()
    chosen = model_manager.choose(Pick(), 8192, machine=RTX_3090, catalog=catalog)
    assert chosen.demo is None
    assert chosen.choice == choose(RTX_3090, catalog, context=8192)
    assert chosen.explanation == chosen.choice.explanation
    pinned = model_manager.choose(
        Pick(model="qwen3.5-9b", quant="Q4_K_M", context=4096), 8192, machine=RTX_3090, catalog=catalog
    )
    picked = pinned.choice
    assert (picked.pair.name, picked.target.quant, picked.context) == ("qwen3.5-9b", "Q4_K_M", 4096)


def test_without_a_gpu_the_demo_pair_unless_a_model_is_named(home, monkeypatch):
    demo = ModelSource("/demo/target", "/demo/drafter", demo=True)
    monkeypatch.setattr(model_source, "demo_source", lambda: demo)
    chosen = model_manager.choose(Pick(context=2048), 8192, machine=NO_GPU)
    assert chosen.demo == dataclasses.replace(demo, context=2048) and chosen.choice is None
    assert chosen.explanation.startswith("CPU, 64 GiB RAM: no GPU (no CUDA device visible), so the tiny built-in demo")
    on_cpu = model_manager.choose(Pick(model="qwen3.5-4b"), 8192, machine=NO_GPU)
    assert on_cpu.choice.pair.name == "qwen3.5-4b" and on_cpu.choice.device == "cpu"

    monkeypatch.setattr(model_source, "demo_source", REAL_DEMO_SOURCE)
    monkeypatch.setattr(demo_module, "demo_dir", lambda: home / "no-demo-data")  # an install without it
    with pytest.raises(model_manager.NoModel, match=r"--target DIR --drafter DIR.*--model NAME"):
        model_manager.choose(Pick(), 8192, machine=NO_GPU)


def test_pull_command_and_labels_name_what_was_chosen(home, tmp_path):
    catalog = load_catalog()
    choice = choose(RTX_3090, catalog, model="qwen3.6-27b", quant="Q4_K_M", drafter_quant="BF16", context=8192)
    assert not choice.vision.loads  # no room for the vision tower beside it: the pull leaves it out, as the app does
    assert model_manager.pull_command(choice) == (
        "dflash-chat pull qwen3.6-27b --quant Q4_K_M --drafter-quant BF16 --vision off"
    )
    roomy = choose(RTX_3090, catalog, model="qwen3.6-27b", quant="Q3_K_M", drafter_quant="Q4_K_M", context=8192)
    assert roomy.vision.loads  # the pull fetches the vision tower too, as a pull of pinned quants does
    assert model_manager.pull_command(roomy) == "dflash-chat pull qwen3.6-27b --quant Q3_K_M --drafter-quant Q4_K_M"
    assert model_manager.label(choice) == "Qwen3.6-27B Q4_K_M + drafter BF16"
    gguf = tmp_path / "Qwen3.6-27B-Q5_K_M.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    own = choose(RTX_3090, catalog, target_file=gguf, drafter_quant="Q8_0", context=8192)
    assert model_manager.pull_command(own) is None
    assert model_manager.label(own) == "Qwen3.6-27B-Q5_K_M.gguf + drafter Q8_0"
    newest = choose(RTX_3090, catalog, model="qwen3.8-27b", quant="Q4_K_M", drafter_quant="Q8_0", context=8192)
    assert model_manager.label(newest) == "Qwen3.8-27B Q4_K_M + DFlash2 drafter Q8_0"
    assert model_manager.resume_advice(own) == "Start dflash-chat again to resume the download."


# --- planning against a Hub ---------------------------------------------------------------------


@pytest.fixture
def tiny_hub(home, monkeypatch, tmp_path):
    """A catalog pair `tiny` in config.toml whose repos are on a local Hub (tiny placeholder files)."""
    import tomlkit

    isolate_hub(monkeypatch, tmp_path)
    pair = {
        "title": "Tiny",
        "rank": 100,
        "default_context": 1024,
        "max_context": 4096,
        "tokenizer": "tiny/Tiny",
        "target": {
            "repo": "tiny/Tiny-GGUF",
            "quants": {"Q8_0": {"pattern": "*Q8_0*.gguf"}},
            "shape": dict(
                layers=4,
                attention_layers=2,
                heads=4,
                kv_heads=2,
                head_dim=16,
                rotary_dim=4,
                linear_key_heads=2,
                linear_value_heads=4,
                linear_key_dim=16,
                linear_value_dim=16,
                conv_kernel=4,
                hidden=64,
                intermediate=128,
                vocab=384,
            ),
        },
        "drafter": {"quants": {"BF16": {"repo": "tiny/Tiny-DFlash", "format": "safetensors"}}},
    }
    paths.config_file().parent.mkdir(parents=True)
    paths.config_file().write_text(tomlkit.dumps({"models": {"tiny": pair}}))
    repos = {
        "tiny/Tiny-GGUF": Repo({"Tiny-Q8_0.gguf": b"GGUF" + bytes(1000), "Tiny-Q4_K_M.gguf": b"GGUF" + bytes(600)}),
        "tiny/Tiny-DFlash": Repo({"config.json": b"{}", "model.safetensors": bytes(500)}),
        "tiny/Tiny": Repo({"tokenizer_config.json": b"{}", "tokenizer.json": b"{}"}),
    }
    with HubServer(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_plan_then_source_for_the_downloaded_files(tiny_hub):
    choice = model_manager.choose(Pick(), 1024, machine=RTX_3090).choice
    plan = model_manager.plan_files(choice)
    assert [f.filename for f in plan.to_fetch] == [
        "Tiny-Q8_0.gguf",
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "tokenizer.json",
    ]
    source = model_manager.source_for(choice, hub.download(plan))
    assert source.target.endswith("/Tiny-Q8_0.gguf") and source.drafter.endswith(f"/snapshots/{plan.files[1].commit}")
    assert (source.title, source.target_quant, source.drafter_quant, source.quant_label) == (
        "Tiny",
        "Q8_0",
        "BF16",
        "Q8_0 · drafter BF16",
    )
    assert (source.device, source.context) == ("cuda:0", 1024)
    assert model_manager.plan_files(choice).to_fetch == ()  # the next start fetches nothing


def test_a_quant_the_repo_lacks_says_which_it_has(tiny_hub):
    choice = model_manager.choose(Pick(model="tiny", quant="Q6_K"), 1024, machine=RTX_3090).choice
    with pytest.raises(model_manager.NoModel) as err:
        model_manager.plan_files(choice)
    assert str(err.value) == (
        "Tiny Q6_K + drafter BF16: tiny/Tiny-GGUF has no Q6_K GGUF (no file matches '*Q6_K*.gguf'); "
        "it has: Q4_K_M, Q8_0. Pick one of those with --quant/--drafter-quant"
    )


def test_offline_names_the_missing_files_and_the_pull_command(tiny_hub, monkeypatch):
    choice = model_manager.choose(Pick(), 1024, machine=RTX_3090).choice
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as err:
        model_manager.plan_files(choice)
    message = str(err.value)
    assert message.startswith("Tiny Q8_0 + drafter BF16 is not downloaded yet: offline (HF_HUB_OFFLINE is set)")
    assert "tiny/Tiny-GGUF *Q8_0*.gguf (Q8_0); tiny/Tiny-DFlash config.json *.safetensors (BF16)" in message
    assert message.endswith("For this model: `dflash-chat pull tiny --quant Q8_0 --drafter-quant BF16`.")
    assert tiny_hub.requests == []


def test_the_vision_tower_is_planned_and_handed_to_the_loader_where_the_pick_loads_it(tiny_hub, monkeypatch):
    """The tiny pair with a tower (`target.vision`, `target.mmproj`): where it fits, its mmproj is one more file of
    the plan, fetched beside the target and named in the source; under `vision = off`, neither."""
    import tomlkit

    document = tomlkit.parse(paths.config_file().read_text())
    target = document["models"]["tiny"]["target"]
    target["vision"] = {"depth": 1, "hidden": 16, "intermediate": 32, "heads": 2, "out_hidden": 64, "max_pixels": 4096}
    target["mmproj"] = {"pattern": "*mmproj*F16*.gguf"}
    paths.config_file().write_text(tomlkit.dumps(document))
    tiny_hub.repos["tiny/Tiny-GGUF"].files.update({"mmproj-F16.gguf": b"GGUF" + bytes(300), "mmproj-BF16.gguf": b"x"})

    choice = model_manager.choose(Pick(), 1024, machine=RTX_3090).choice
    assert choice.vision.loads
    plan = model_manager.plan_files(choice)
    assert [(f.role, f.filename) for f in plan.to_fetch][-1] == ("mmproj", "mmproj-F16.gguf")
    source = model_manager.source_for(choice, hub.download(plan))
    assert source.vision is not None and source.vision.endswith("/mmproj-F16.gguf") and source.vision_chosen
    assert source.vision.rsplit("/", 1)[0] == source.target.rsplit("/", 1)[0]  # the target repo's snapshot

    off = model_manager.choose(Pick(), 1024, machine=RTX_3090, vision="off").choice
    assert not off.vision.loads
    assert "mmproj" not in [f.role for f in model_manager.plan_files(off).files]
    unloaded = model_manager.source_for(off, hub.download(model_manager.plan_files(off)))
    assert unloaded.vision is None and unloaded.vision_chosen  # the loader leaves it out
    assert model_source.vision_to_load(unloaded, "auto") is False
