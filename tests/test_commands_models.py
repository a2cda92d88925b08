"""`dflash-chat models`, `pull` and `doctor` through dflash_chat.cli.main with captured output."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dflash_chat import cli
from dflash_chat.models import hardware, hub
from dflash_chat.models.catalog import load_catalog
from dflash_chat.models.hardware import GIB, Gpu, Machine
from dflash_chat.models.sizes import size_text
from tests.hubserver import HubServer, Repo, isolate_hub

TINY_PAIR = """
[models.tiny]
title = "Tiny"
rank = 99
default_context = 4096
max_context = 32768
tokenizer = "tiny/Tiny"

[models.tiny.target]
repo = "tiny/Tiny-GGUF"
shape = { layers = 4, attention_layers = 1, heads = 2, kv_heads = 1, head_dim = 16, rotary_dim = 4, linear_key_heads = 1, linear_value_heads = 2, linear_key_dim = 8, linear_value_dim = 8, conv_kernel = 4, hidden = 32, intermediate = 64, vocab = 256 }
quants.Q8_0 = { pattern = "*Q8_0*.gguf", size_gb = 0.00006 }
quants.Q4_K_M = { pattern = "*Q4_K_M*.gguf", size_gb = 0.00004 }

[models.tiny.drafter]
shape = { layers = 1, kv_heads = 1, head_dim = 16, hidden = 32 }
quants.BF16 = { repo = "tiny/Tiny-DFlash", format = "safetensors", size_gb = 0.00003 }
"""

RTX_3090 = Machine((Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GIB, int(23.5 * GIB)),), 64 * GIB, 48 * GIB)
CPU_ONLY = Machine((), 16 * GIB, 12 * GIB, "CPU-only build of torch")


@pytest.fixture
def server():
    rng = np.random.default_rng(7)
    repos = {
        "tiny/Tiny-GGUF": Repo({"Tiny-Q8_0.gguf": rng.bytes(60_000), "Tiny-Q4_K_M.gguf": rng.bytes(40_000)}),
        "tiny/Tiny-DFlash": Repo({"config.json": b"{}", "model.safetensors": rng.bytes(30_000)}),
        "tiny/Tiny": Repo({"tokenizer_config.json": b"{}", "tokenizer.json": b"{}"}),
    }
    with HubServer(repos) as running:
        yield running


@pytest.fixture
def home(monkeypatch, tmp_path, server):
    """DFLASH_CHAT_HOME with the tiny pair in config.toml, the test Hub, a probe double."""
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "app"))
    (tmp_path / "app" / "config").mkdir(parents=True)
    (tmp_path / "app" / "config" / "config.toml").write_text(TINY_PAIR)
    cache = isolate_hub(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setattr(hardware, "probe", lambda: RTX_3090)
    return cache


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def row(out: str, model: str, quant: str) -> list[str]:
    """The cells of the table row for model + quant (cells are at least two spaces apart)."""
    line = next(line for line in out.splitlines() if line.split()[:2] == [model, quant])
    return re.split(r"\s{2,}", line)


def test_pull_then_models_shows_it_cached(home, capsys):
    code, out, err = run(capsys, "pull", "tiny", "--quant", "Q4_K_M")
    assert code == 0, err
    size = size_text(40_000 + 2 + 30_000 + 2 + 2)  # Q4_K_M, config, weights, tokenizer files
    assert out.splitlines()[0] == f"Tiny: 5 files, {size}, {size} to download -> {home}"
    lines = [line for line in out.splitlines() if line.startswith(("target:", "drafter:", "tokenizer:"))]
    paths = dict(line.split(":", 1) for line in lines)
    assert paths["target"].strip().endswith("Tiny-Q4_K_M.gguf")
    assert (home / paths["target"].strip()).exists()

    code, out, err = run(capsys, "models")
    assert code == 0, err
    assert out.splitlines()[0] == f"This machine: RTX 3090 24 GiB, {size_text(RTX_3090.available)} free"
    tiny = load_catalog().get("tiny")
    need = hardware.budget(tiny, tiny.target("Q4_K_M"), tiny.drafter("BF16"), 8192, RTX_3090).need
    assert row(out, "tiny", "Q4_K_M") == ["tiny", "Q4_K_M", "40 kB", "BF16", f"{size_text(need)} @8k", "yes", "yes"]
    assert row(out, "tiny", "Q8_0")[5:] == ["yes", "drafter+tokenizer", "<- pick"]  # rank 99, Q8_0 fits
    assert row(out, "qwen3.6-27b", "Q4_K_M")[6] == "-"
    assert "Pick: RTX 3090 24 GiB: Tiny Q8_0 + drafter BF16;" in out


def test_pull_without_a_model_fetches_the_pick(home, capsys, server):
    code, out, err = run(capsys, "pull")
    assert code == 0, err
    assert out.splitlines()[0].startswith("RTX 3090 24 GiB: Tiny Q8_0 + drafter BF16;")
    assert server.gets("/cdn/")  # it really downloaded
    code, out, _ = run(capsys, "pull")
    assert "all cached" in out.splitlines()[1]


def test_pull_of_a_model_too_big_for_this_machine_fetches_its_smallest_option(home, capsys, monkeypatch):
    import argparse

    from dflash_chat.commands import pull

    small = Machine((Gpu(0, "NVIDIA GeForce RTX 4060", 8 * GIB, int(7.6 * GIB)),), 32 * GIB, 24 * GIB)
    monkeypatch.setattr(hardware, "probe", lambda: small)
    args = argparse.Namespace(model="qwen3.6-27b", quant=None, drafter_quant=None, context=None)
    pair, target, drafter, mmproj = pull._what_to_pull(load_catalog(), args)
    # the smallest: the smallest quant alone (it drafts with its own MTP layer: no drafter to fetch), and no vision
    # tower where the model itself does not fit
    assert (pair.name, target.quant, drafter, mmproj) == ("qwen3.6-27b", "Q3_K_M", None, None)
    out = capsys.readouterr().out
    assert "will not fit" in out and "Fetching the smallest anyway: Qwen3.6-27B Q3_K_M (choose with --quant)" in out


def test_pull_a_quant_the_repo_lacks(home, capsys):
    code, out, err = run(capsys, "pull", "tiny", "--quant", "Q6_K")
    assert code == 2
    assert err == (
        "dflash-chat: tiny/Tiny-GGUF has no Q6_K GGUF (no file matches '*Q6_K*.gguf'); "
        "it has: Q4_K_M, Q8_0. Pick one of those with --quant/--drafter-quant\n"
    )


def test_pull_offline_says_what_is_missing(home, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = run(capsys, "pull", "tiny", "--quant", "Q8_0")
    assert code == 2 and err.count("\n") == 1
    assert "tiny/Tiny-GGUF *Q8_0*.gguf (Q8_0); tiny/Tiny-DFlash config.json *.safetensors (BF16); " in err
    assert "Unset HF_HUB_OFFLINE" in err


def test_models_on_a_cpu_only_machine(home, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "probe", lambda: CPU_ONLY)
    code, out, err = run(capsys, "models", "--context", "8192")
    assert code == 0, err
    assert out.splitlines()[0] == f"This machine: CPU, 16 GiB RAM, {size_text(12 * GIB)} free (CPU-only build of torch)"
    assert "Pick: CPU, 16 GiB RAM: no GPU (CPU-only build of torch), so the tiny built-in demo model;" in out
    assert row(out, "qwen3.6-27b", "Q8_0")[5] == "no"
    four_b = row(out, "qwen3.5-4b", "Q8_0")
    assert (four_b[3], four_b[5:]) == ("BF16", ["yes", "-"])  # fits, but the app runs the demo pair
    assert "<- pick" not in out


def app_explanation(machine: Machine) -> str:
    """What the chat app itself says it runs on `machine` (the model manager, settings as saved)."""
    from dflash_chat import settings
    from dflash_chat.runtime import model_manager
    from dflash_chat.runtime.model_source import from_settings

    current = settings.load()
    return model_manager.choose(from_settings(current), current.context_length, machine=machine).explanation


@pytest.mark.parametrize("machine", [CPU_ONLY, RTX_3090], ids=["cpu-only", "rtx-3090"])
def test_models_doctor_and_the_app_agree_on_the_pick(home, capsys, monkeypatch, machine):
    monkeypatch.setattr(hardware, "probe", lambda: machine)
    expected = app_explanation(machine)
    _, models_out, _ = run(capsys, "models")
    _, doctor_out, _ = run(capsys, "doctor")
    assert f"Pick: {expected}" in models_out.splitlines()
    assert f"OK   model: {expected}" in doctor_out.splitlines()


def test_pull_without_a_model_on_a_cpu_only_machine_fetches_nothing(home, capsys, monkeypatch, server):
    monkeypatch.setattr(hardware, "probe", lambda: CPU_ONLY)
    code, out, err = run(capsys, "pull")
    assert code == 0, err
    assert out.splitlines() == [
        app_explanation(CPU_ONLY),
        "Nothing to download. To fetch a real model anyway: dflash-chat pull qwen3.5-4b",
    ]
    assert not server.requests


def test_models_vram_plans_for_another_card_without_probing(home, capsys, monkeypatch):
    from dflash_chat import paths

    paths.config_file().write_text("")  # the shipped pairs only

    def no_probe():
        raise AssertionError("--vram must not probe this machine")

    monkeypatch.setattr(hardware, "probe", no_probe)
    code, out, err = run(capsys, "models", "--vram", "24", "--context", "32768")
    assert code == 0, err
    assert out.splitlines()[0] == "Planning for a 24 GiB GPU (--vram: 25.8 GB), all of it free"
    assert (
        "Pick: planned GPU 24 GiB: Qwen3.8-27B Q4_K_M + DFlash2 drafter Q8_0 (DFlash2 drafts 8-token blocks "
        "with ~20 % longer acceptance);"
    ) in out
    assert row(out, "qwen3.8-27b", "Q4_K_M")[5:] == ["yes", "-", "<- pick"]
    assert row(out, "qwen3.8-27b", "Q8_0")[5] == "no"
    assert row(out, "qwen3.6-27b", "Q4_K_M")[5:] == ["yes", "-"]  # it fits too, ranked below
    assert "Drafting: drafts with the DFlash2 drafter, the target's own MTP layer and prompt lookup" in out
    _, out, _ = run(capsys, "models", "--vram", "80", "--context", "32768")
    assert "Pick: planned GPU 80 GiB: Qwen3.8-27B Q8_0 + DFlash2 drafter Q8_0 (" in out
    assert row(out, "qwen3.6-35b-a3b", "Q8_0")[3] == "MTP"  # the MoE target drafts with its MTP layer first
    # the 35B-A3B drafter's training shows where the repo holds two
    _, out, _ = run(capsys, "models", "--vram", "80", "--context", "32768", "--drafter-quant", "Q8_0")
    assert row(out, "qwen3.6-35b-a3b", "Q8_0")[3] == "Q8_0 (2026-04)"
    code, _, err = run(capsys, "models", "--vram", "0")
    assert code == 2 and "--vram takes the GPU's size in GiB" in err


def test_unknown_model_is_one_line(home, capsys):
    code, out, err = run(capsys, "pull", "llama")
    assert code == 2 and err.startswith("dflash-chat: unknown model 'llama'; known models: ")


def test_doctor_reports_each_line_ok_or_what_to_do(home, capsys):
    code, out, err = run(capsys, "doctor")
    lines = out.splitlines()
    assert all(line.startswith(("OK   ", "FIX  ")) for line in lines[:-1])
    assert lines[0].startswith("OK   Python 3.")
    assert any(line.startswith("OK   torch ") for line in lines)
    assert any("kernels: " in line for line in lines)
    assert any(line.startswith(f"OK   HF cache {home}") for line in lines)
    assert any(line.startswith("OK   model: RTX 3090 24 GiB: Tiny Q8_0") for line in lines)
    assert f"OK   Hub: {hub.default_endpoint()} reachable (" in out  # the test Hub answered
    assert any("1 model pair(s) of your own" in line for line in lines)
    fixes = [line for line in lines if line.startswith("FIX")]
    assert all(" -> " in line for line in fixes)  # every problem says what to do
    assert code == (1 if fixes else 0)
    assert lines[-1] == ("All good." if not fixes else f"{len(fixes)} thing(s) to fix.")


def test_doctor_flags_a_broken_config(home, capsys):
    from dflash_chat import paths

    paths.config_file().write_text("[models.tiny\n")
    code, out, _ = run(capsys, "doctor")
    assert code == 1
    line = next(line for line in out.splitlines() if line.startswith("FIX  config: "))
    assert "is not valid TOML" in line and line.endswith(f"-> edit {paths.config_file()}")


def test_doctor_says_when_the_hub_cannot_be_reached(home, monkeypatch):
    import socket

    from dflash_chat.commands import doctor

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: refused at once
    check = doctor.hub_reachable(f"http://127.0.0.1:{port}")
    assert not check.ok
    assert check.line() == (
        f"FIX  Hub: cannot reach http://127.0.0.1:{port} (ConnectError) -> check the connection "
        "or the proxy (HTTPS_PROXY); HF_HUB_OFFLINE=1 runs downloaded models only"
    )

    silent = socket.socket()  # accepts connections, never answers: the short timeout decides
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        monkeypatch.setattr(doctor, "HUB_TIMEOUT", 0.3)
        check = doctor.hub_reachable(f"http://127.0.0.1:{silent.getsockname()[1]}")
        assert not check.ok and "Timeout" in check.text
    finally:
        silent.close()


def test_doctor_torch_hints_fit_a_pipx_install(monkeypatch, tmp_path):
    from dflash_chat.commands import doctor

    venv = tmp_path / "pipx" / "venvs" / "dflash-chat"
    venv.mkdir(parents=True)
    (venv / "pipx_metadata.json").write_text("{}")
    monkeypatch.setattr("sys.prefix", str(venv))
    [missing] = doctor.torch_checks(None)
    assert missing.fix == (
        "install it: pipx runpip dflash-chat install torch --index-url https://download.pytorch.org/whl/cu128 "
        "(CPU only: pipx runpip dflash-chat install torch --index-url https://download.pytorch.org/whl/cpu)"
    )
    monkeypatch.setattr("sys.prefix", str(tmp_path / "plain-venv"))
    assert doctor.install_command("triton").endswith(" -m pip install triton")


def test_pull_of_a_gated_drafter_without_a_token_is_one_line_and_fetches_nothing(home, capsys, server):
    server.repos["tiny/Tiny-DFlash"].gated = "manual"
    code, out, err = run(capsys, "pull", "tiny", "--quant", "Q4_K_M")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"dflash-chat: tiny/Tiny-DFlash is gated: accept its terms on {server.url}/tiny/Tiny-DFlash")
    assert "`hf auth login` or set HF_TOKEN" in err
    assert not server.gets("/resolve/") and not server.gets("/cdn/")


# --- Qwen3.8-27B + DFlash2, the shipped pair, against the test Hub ----------------------------------

# The repos as the catalog pins them: each answers at the catalog's commit, with the real file names
# (tiny contents) and the files beside them that a pattern must not take.
QWEN38_REPOS = {
    "unsloth/Qwen3.8-27B-GGUF": (
        "fdd03b8bbd279c1694563650e79d85a2373d9934",
        {
            "Qwen3.8-27B-Q8_0.gguf": 8_000,
            "Qwen3.8-27B-Q4_K_M.gguf": 4_000,
            "Qwen3.8-27B-Q3_K_M.gguf": 3_200,
            "Qwen3.8-27B-Q3_K_S.gguf": 3_000,
            "Qwen3.8-27B-UD-Q4_K_XL.gguf": 4_400,
            "Qwen3.8-27B-UD-Q3_K_XL.gguf": 3_100,
            "mmproj-F16.gguf": 900,
            "mmproj-BF16.gguf": 901,
            "mmproj-F32.gguf": 1_800,
            "config.json": 40,
        },
    ),
    "incoai/Qwen3.8-27B-DFlash2-GGUF": (
        "51962825493a48b846b40126d35c799ac4093ad0",
        {
            "Qwen3.8-27B-DFlash2-Q8_0.gguf": 2_000,
            "Qwen3.8-27B-DFlash2-Q4_K_M.gguf": 1_100,
            "Qwen3.8-27B-DFlash2-BF16.gguf": 3_800,
        },
    ),
    "z-lab/Qwen3.8-27B-DFlash2": (
        "50307d4c4cde6860d4eee73e2547cd786fe8e8a4",
        {
            "config.json": 60,
            "model.safetensors": 3_850,
            "README.md": 30,
        },
    ),
    "Qwen/Qwen3.8-27B": (
        "1d4bf0f2ff6012fd82039f2fa52739d0dd7c60c0",
        {
            "tokenizer_config.json": 20,
            "tokenizer.json": 50,
            "chat_template.jinja": 10,
            "config.json": 30,
            "model-00001-of-00015.safetensors": 500,
        },
    ),
}


@pytest.fixture
def qwen38_home(home, server):
    """The shipped pairs only (an empty config.toml), the Qwen3.8-27B repos on the test Hub."""
    from dflash_chat import paths

    paths.config_file().write_text("")
    rng = np.random.default_rng(38)
    for repo, (commit, files) in QWEN38_REPOS.items():
        server.repos[repo] = Repo({name: rng.bytes(size) for name, size in files.items()}, commit=commit)
    return home


def pulled(out: str) -> dict[str, str]:
    lines = [line for line in out.splitlines() if line.startswith(("target:", "drafter:", "tokenizer:", "vision:"))]
    return {key: value.strip() for key, value in (line.split(":", 1) for line in lines)}


def test_pull_qwen38_fetches_the_target_quant_and_the_dflash2_drafter_the_picker_chose(qwen38_home, capsys, server):
    code, out, err = run(capsys, "pull", "qwen3.8-27b")
    assert code == 0, err
    lines = out.splitlines()
    # the picker's line for this machine (the 3090 double, the app's 8k context), then the plan
    assert lines[0].startswith(
        "RTX 3090 24 GiB: Qwen3.8-27B Q4_K_M + DFlash2 drafter Q8_0 (DFlash2 drafts 8-token "
        "blocks with ~20 % longer acceptance);"
    )
    size = size_text(4_000 + 2_000 + 20 + 50 + 10 + 30)  # target, drafter, the tokenizer repo's files
    assert lines[1] == f"Qwen3.8-27B: 6 files, {size}, {size} to download -> {qwen38_home}"
    files = pulled(out)
    assert files["target"].endswith("Qwen3.8-27B-Q4_K_M.gguf")  # not UD-Q4_K_XL, not the mmproj
    assert files["drafter"].endswith("Qwen3.8-27B-DFlash2-Q8_0.gguf")
    assert "models--incoai--Qwen3.8-27B-DFlash2-GGUF" in files["drafter"]
    assert "models--Qwen--Qwen3.8-27B" in files["tokenizer"]
    for key in ("target", "drafter"):
        assert (qwen38_home / files[key]).read_bytes() == server.repos[
            "unsloth/Qwen3.8-27B-GGUF" if key == "target" else "incoai/Qwen3.8-27B-DFlash2-GGUF"
        ].files[Path(files[key]).name]
    # every file came from the pinned commit, none from main
    resolves = [r.path for r in server.gets("/resolve/")]
    assert resolves and all("/resolve/main/" not in path for path in resolves)
    assert any("/resolve/fdd03b8bbd279c1694563650e79d85a2373d9934/" in path for path in resolves)
    assert not any("safetensors" in path or "mmproj" in path for path in resolves)

    code, out, _ = run(capsys, "models", "--model", "qwen3.8-27b")
    assert code == 0
    assert row(out, "qwen3.8-27b", "Q4_K_M")[3:] == [
        "Q8_0 (DFlash2)",
        row(out, "qwen3.8-27b", "Q4_K_M")[4],
        "yes",
        "yes",
        "<- pick",
    ]
    assert row(out, "qwen3.8-27b", "Q3_K_M")[5:] == ["yes", "drafter+tokenizer"]  # Q8_0 drafter cached
    # Q8_0 does not fit here, not even alone: its row shows the smallest option, the target alone (its MTP
    # layer drafts), not downloaded
    assert row(out, "qwen3.8-27b", "Q8_0")[3] == "MTP"
    assert row(out, "qwen3.8-27b", "Q8_0")[5:] == ["no", "tokenizer"]


def test_pull_qwen38_with_the_bf16_drafter_fetches_z_labs_checkpoint(qwen38_home, capsys, server):
    code, out, err = run(capsys, "pull", "qwen3.8-27b", "--quant", "Q3_K_S", "--drafter-quant", "BF16")
    assert code == 0, err
    # config.json and the weights, no README; with a pinned quant, the vision tower's F16 mmproj (not BF16 or F32)
    size = size_text(3_000 + 60 + 3_850 + 20 + 50 + 10 + 30 + 900)
    assert out.splitlines()[0] == f"Qwen3.8-27B: 8 files, {size}, {size} to download -> {qwen38_home}"
    files = pulled(out)
    assert files["target"].endswith("Qwen3.8-27B-Q3_K_S.gguf")
    snapshot = "models--unsloth--Qwen3.8-27B-GGUF/snapshots/fdd03b8bbd279c1694563650e79d85a2373d9934/"
    assert files["vision"].endswith(snapshot + "mmproj-F16.gguf")
    tower = server.repos["unsloth/Qwen3.8-27B-GGUF"].files["mmproj-F16.gguf"]
    assert (qwen38_home / files["vision"]).read_bytes() == tower
    drafter = qwen38_home / files["drafter"]
    assert "models--z-lab--Qwen3.8-27B-DFlash2" in str(drafter)
    assert sorted(p.name for p in drafter.iterdir()) == ["config.json", "model.safetensors"]


def test_doctor_and_models_know_the_qwen38_pair(qwen38_home, capsys):
    _, models_out, _ = run(capsys, "models")
    _, doctor_out, _ = run(capsys, "doctor")
    pick = next(line for line in models_out.splitlines() if line.startswith("Pick: "))
    expected = app_explanation(RTX_3090)
    assert pick == f"Pick: {expected}"
    assert expected.startswith("RTX 3090 24 GiB: Qwen3.8-27B Q4_K_M + DFlash2 drafter Q8_0 (DFlash2 drafts 8-token")
    assert expected.endswith("left for an 8k context")
    assert f"OK   model: {expected}" in doctor_out.splitlines()
    for quant in ("Q4_K_M", "Q3_K_M", "Q3_K_S"):  # every quant that fits, with its DFlash2 drafter
        assert row(models_out, "qwen3.8-27b", quant)[3].endswith("(DFlash2)")
    assert row(models_out, "qwen3.8-27b", "Q8_0")[3] == "MTP"  # fits nowhere: the smallest, the target alone
    assert row(models_out, "qwen3.6-27b", "Q4_K_M")[3] == "Q8_0"  # DFlash pairs as they were


def test_models_vram_16_and_doctor_say_which_methods_the_pick_has_and_why(home, capsys, monkeypatch):
    """16 GB: no DFlash2 drafter fits beside the 27B's best quant, so it runs alone with its own MTP layer;
    `models` and `doctor` name the methods and the reason, and the MoE target drafts with MTP first."""
    from dflash_chat import paths

    paths.config_file().write_text("")  # the shipped pairs only
    code, out, err = run(capsys, "models", "--vram", "16")
    assert code == 0, err
    assert "Qwen3.8-27B Q3_K_M alone, drafting with its own MTP layer (no drafter fits beside it)" in out
    assert row(out, "qwen3.8-27b", "Q3_K_M")[3] == "MTP" and row(out, "qwen3.8-27b", "Q3_K_M")[-1] == "<- pick"
    drafting = next(line for line in out.splitlines() if line.startswith("Drafting: "))
    assert drafting.startswith("Drafting: drafts with the target's own MTP layer and prompt lookup")
    assert "none fits beside this quant" in drafting
    _, out, _ = run(capsys, "models", "--vram", "32", "--model", "qwen3.6-35b-a3b")
    assert "(MoE: its MTP layer drafts faster than a DFlash drafter here)" in out
    monkeypatch.setattr(hardware, "probe", lambda: hardware.planned(16))
    _, doctor_out, _ = run(capsys, "doctor")
    assert f"OK   {drafting.replace('Drafting: ', 'drafting: ')}" in doctor_out.splitlines()


def test_doctor_counts_the_prefix_cache_in_checkpoints_of_the_pick(home, capsys, monkeypatch):
    from dflash_chat import paths
    from dflash_chat.commands.models import app_choice
    from dflash_chat.engine import memory

    monkeypatch.setattr(hardware, "probe", lambda: RTX_3090)
    _, choice = app_choice(RTX_3090, load_catalog())
    shape = choice.drafter.shape if choice.drafter else None
    one = memory.checkpoint_bytes(choice.pair.target_shape, shape, choice.context, RTX_3090.compute_bytes)
    assert one > 0  # a GDN hybrid: its state cannot be truncated
    _, out, _ = run(capsys, "doctor")
    assert (
        "OK   prefix cache: prefix_cache_mib = 1024 MiB of prompt checkpoints on the model's device besides the "
        f"model: {1024 * 2**20 // one} of {choice.pair.title} ({size_text(one)} each)"
    ) in out.splitlines()
    rows = memory.row_bytes(choice.pair.target_shape, shape, RTX_3090.compute_bytes)
    assert (
        "OK   parked conversations: prefix_cache_ram_mib = 4096 MiB of host memory for conversations another "
        f"request displaced: about {4096 * 2**20 // rows:,} tokens of {choice.pair.title} "
        f"({size_text(rows * 1000)} per 1000 tokens)"
    ) in out.splitlines()
    config = paths.config_file()
    config.write_text("prefix_cache_mib = 0\nprefix_cache_ram_mib = 0\n" + config.read_text())  # before the tables
    _, out, _ = run(capsys, "doctor")
    lines = out.splitlines()
    assert any(line.startswith("OK   prefix cache: prefix_cache_mib = 0 MiB") and "off" in line for line in lines)
    assert any(
        line.startswith("OK   parked conversations: prefix_cache_ram_mib = 0 MiB") and "off" in line for line in lines
    )
    config.write_text(config.read_text().replace("prefix_cache_ram_mib = 0", "prefix_cache_ram_mib = 40000"))
    _, out, _ = run(capsys, "doctor")
    assert any(
        line.startswith("FIX  parked conversations: prefix_cache_ram_mib = 40000 MiB")
        and f"more than half of this machine's {size_text(64 * 2**30)} of RAM" in line
        and "prefix_cache_ram_mib lower" in line
        for line in out.splitlines()
    )


def test_over_the_catalog_the_pick_is_the_tables_first_row_that_fits_and_readme_says_so(home, capsys):
    """One rule, one story: on every card size the pick is the first row of `models` marked to fit (pairs by
    rank, a pair's largest target quant first), and README's 16 GiB pick is the one `models --vram 16` makes."""
    from pathlib import Path

    from dflash_chat import paths
    from dflash_chat.models.catalog import load_catalog

    paths.config_file().write_text("")  # the shipped pairs only
    for vram in (8, 12, 16, 20, 24, 32, 48, 80):
        code, out, err = run(capsys, "models", "--vram", str(vram))
        assert code == 0, err
        rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()[2:] if line.startswith("qwen")]
        fitting = [i for i, cells in enumerate(rows) if cells[5] == "yes"]
        assert [i for i, cells in enumerate(rows) if cells[-1] == "<- pick"] == fitting[:1], (vram, out)
        assert out.splitlines()[0] == f"Planning for a {vram} GiB GPU (--vram: {size_text(vram * GIB)}), all of it free"
    sixteen = hardware.choose(hardware.planned(16), load_catalog(), context=8192)  # the app's context_length
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    alone = "alone with its MTP layer" if sixteen.drafter is None else f"beside the {sixteen.drafter.quant} drafter"
    assert f"the pick from 16 GiB cards ({sixteen.target.quant} {alone}, at an 8k context)" in readme
    assert sixteen.pair.name == "qwen3.8-27b" and "Q3_K_S at an 8k context" not in readme


def test_doctor_on_a_cpu_only_machine_with_a_cpu_torch_has_nothing_to_fix_there(monkeypatch):
    """README recommends the CPU build of torch where there is no GPU: that is right, not a FIX (exit 1). FIX
    belongs where the driver has a GPU that this torch cannot use (the GPU is the one double here)."""
    import torch

    from dflash_chat.commands import doctor

    if torch.version.cuda is not None or doctor.nvidia_gpu_present():
        pytest.skip("this machine has a CUDA build of torch or an NVIDIA GPU")
    cuda = next(c for c in doctor.torch_checks(torch) if c.text.startswith("CUDA"))
    assert cuda.ok and cuda.line() == "OK   CUDA: none (a CPU-only torch, and no NVIDIA GPU here: it runs on the CPU)"
    monkeypatch.setattr(doctor, "nvidia_gpu_present", lambda: True)
    cuda = next(c for c in doctor.torch_checks(torch) if c.text.startswith("CUDA"))
    assert not cuda.ok and cuda.line().startswith("FIX  CUDA: this torch is a CPU-only build, and this machine has")
    assert "--force-reinstall torch --index-url https://download.pytorch.org/whl/cu128" in cuda.fix


A6000 = Machine((Gpu(0, "NVIDIA RTX A6000", 48 * GIB, int(47.5 * GIB)),), 64 * GIB, 48 * GIB)


@pytest.mark.parametrize("machine", [RTX_3090, A6000], ids=["rtx-3090", "a6000"])
def test_models_and_doctor_say_whether_the_pick_loads_vision_and_why(qwen38_home, capsys, monkeypatch, machine):
    from dflash_chat import settings
    from dflash_chat.runtime import model_manager
    from dflash_chat.runtime.model_source import from_settings

    monkeypatch.setattr(hardware, "probe", lambda: machine)
    current = settings.load()
    choice = model_manager.choose(from_settings(current), current.context_length, machine=machine).choice
    assert choice.vision.loads == (machine is A6000)  # the 3090's 8k pick leaves no room for the tower
    _, models_out, _ = run(capsys, "models")
    _, doctor_out, _ = run(capsys, "doctor")
    lines = models_out.splitlines()
    assert lines[lines.index(f"Drafting: {choice.drafting}") + 1] == choice.vision.line
    assert choice.vision.line.startswith("Vision: loaded (" if choice.vision.loads else "Vision: not loaded: ")
    assert f"OK   vision: {choice.vision.why}" in doctor_out.splitlines()
    _, off_out, _ = run(capsys, "models", "--vision", "off")
    assert "Vision: off (the vision setting); images are refused" in off_out.splitlines()
    settings.update({"vision": "off"})
    _, doctor_out, _ = run(capsys, "doctor")
    assert "OK   vision: off (the vision setting); images are refused" in doctor_out.splitlines()


def test_a_pair_without_a_tower_says_so(home, capsys):
    _, out, _ = run(capsys, "models")
    assert "Vision: not loaded: this model has no vision tower in the catalog" in out.splitlines()


def test_pull_fetches_the_tower_where_the_app_loads_it_and_models_counts_it(qwen38_home, capsys, monkeypatch, server):
    monkeypatch.setattr(hardware, "probe", lambda: A6000)
    code, out, err = run(capsys, "pull", "--vision", "off")
    assert code == 0, err
    assert "vision" not in pulled(out)
    _, out, _ = run(capsys, "models")
    pick = next(line for line in out.splitlines() if line.endswith("<- pick"))
    quant = pick.split()[1]
    assert row(out, "qwen3.8-27b", quant)[6] == "target+drafter+tokenizer"  # the app would fetch the tower still

    code, out, err = run(capsys, "pull")
    assert code == 0, err
    assert out.splitlines()[1].startswith("Qwen3.8-27B: 7 files") and out.splitlines()[1].endswith(
        f"{size_text(900)} to download -> {qwen38_home}"
    )
    assert pulled(out)["vision"].endswith("/mmproj-F16.gguf")
    _, out, _ = run(capsys, "models")
    assert row(out, "qwen3.8-27b", quant)[6:] == ["yes", "<- pick"]
