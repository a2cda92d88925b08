"""The first run: `dflash-chat` with no model named chooses, downloads, loads and chats.

The Hub is tests/hubserver.py on loopback (the real huggingface_hub client talks to it); the
catalog pair `tiny` lives in the user's config.toml and points at its repos, which hold a tiny
Q8_0 GGUF target, a Q8_0 GGUF drafter and the tokenizer files. The GPU probe is the only double:
it reports a 24 GB card, and DFLASH_CHAT_DEVICE=cpu makes the engine load on the CPU anyway.
"""

from __future__ import annotations

import threading

import pytest
import tomlkit

from dflash_chat import cli, paths
from dflash_chat import settings as settings_module
from dflash_chat.commands.chat import build_app
from dflash_chat.models import demo, hardware, hub
from dflash_chat.models.catalog import load_catalog
from dflash_chat.models.hardware import GIB, Gpu, Machine
from dflash_chat.runtime import model_source
from dflash_chat.runtime.events import DownloadNeeded, ModelUnavailable
from dflash_chat.runtime.model_source import DEVICE_ENV, ModelSource
from dflash_chat.ui.download_screen import DownloadScreen
from dflash_chat.ui.history_screen import HistoryScreen
from dflash_chat.ui.widgets.stats_panel import format_speed
from tests.hubserver import HubServer, Repo, isolate_hub

from .conftest import fast_settings, run, send, wait_for

TARGET_REPO, DRAFTER_REPO, TOKENIZER_REPO = "tiny/Tiny-GGUF", "tiny/Tiny-DFlash-GGUF", "tiny/Tiny"
RTX_4090 = Machine((Gpu(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB),), 64 * GIB, 60 * GIB)
NO_GPU = Machine((), 16 * GIB, 12 * GIB, "CPU-only build of torch")
PULL = "dflash-chat pull tiny --quant Q8_0 --drafter-quant Q8_0"
REAL_PROBE = hardware.probe

TINY_PAIR = {
    "title": "Tiny",
    "rank": 100,  # above the shipped pairs: the first choice on any GPU
    "default_context": 1024,
    "max_context": 4096,
    "tokenizer": TOKENIZER_REPO,
    "target": {
        "repo": TARGET_REPO,
        "shape": {
            "layers": 4,
            "attention_layers": 2,
            "heads": 4,
            "kv_heads": 2,
            "head_dim": 16,
            "rotary_dim": 4,
            "linear_key_heads": 2,
            "linear_value_heads": 4,
            "linear_key_dim": 16,
            "linear_value_dim": 16,
            "conv_kernel": 4,
            "hidden": 64,
            "intermediate": 128,
            "vocab": 384,
        },
        "quants": {"Q8_0": {"pattern": "*Q8_0*.gguf", "size_gb": 0.0003}},
    },
    "drafter": {
        "shape": {"layers": 2, "kv_heads": 2, "head_dim": 16, "hidden": 64, "block_size": 16},
        "quants": {"Q8_0": {"repo": DRAFTER_REPO, "pattern": "*q8_0*.gguf", "size_gb": 0.0001}},
    },
}


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """The bytes of the three repos: GGUFs written from a tiny random pair, its tokenizer files."""
    from safetensors.torch import load_file

    from tests.engine.gguf_write import write_drafter_gguf, write_target_gguf
    from tests.engine.tiny import write_drafter, write_target

    root = tmp_path_factory.mktemp("tiny-repos")
    hf = write_target(root / "target", seed=0)
    drafter_cfg = write_drafter(root / "drafter", root / "target", seed=1)
    # no tokenizer in the GGUF: the chat template must come from the tokenizer repo, as for Qwen
    target = write_target_gguf(root / "Tiny-Q8_0.gguf", hf.state_dict(), hf.config.to_dict(), "Q8_0")
    drafter_state = load_file(str(root / "drafter" / "model.safetensors"))
    drafter = write_drafter_gguf(root / "Tiny-DFlash-q8_0.gguf", drafter_state, drafter_cfg, "Q8_0")
    tokenizer = {
        n: (root / "target" / n).read_bytes()
        for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    }
    return {
        TARGET_REPO: {"Tiny-Q8_0.gguf": target.read_bytes(), "README.md": b"# Tiny\n"},
        DRAFTER_REPO: {"Tiny-DFlash-q8_0.gguf": drafter.read_bytes()},
        TOKENIZER_REPO: tokenizer,
    }


@pytest.fixture
def server(repo_files):
    with HubServer({name: Repo(dict(files)) for name, files in repo_files.items()}) as running:
        yield running


@pytest.fixture
def first_run(home, server, monkeypatch, tmp_path):
    """A fresh machine: empty HF cache, the tiny pair in config.toml, a 24 GB GPU (loading on CPU)."""
    cache = isolate_hub(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    monkeypatch.setattr(hub, "RETRY_WAIT", 0.01)
    monkeypatch.setattr(hub, "PROGRESS_INTERVAL", 0.0)
    monkeypatch.setattr(hardware, "probe", lambda: RTX_4090)
    paths.config_file().parent.mkdir(parents=True, exist_ok=True)
    paths.config_file().write_text(tomlkit.dumps({"models": {"tiny": TINY_PAIR}}))
    return cache


def start(*argv: str, **settings):
    """The app exactly as `dflash-chat ARGV` builds it."""
    return build_app(cli.build_parser().parse_args(list(argv)), fast_settings(**settings))


class Seen:
    """Messages (or the backend events they carry) of the given types, each once (a message is seen
    at every node it bubbles through)."""

    def __init__(self, *kinds) -> None:
        self.kinds = kinds
        self.messages = []

    def __call__(self, message) -> None:
        message = getattr(message, "event", message)
        if isinstance(message, self.kinds) and not any(m is message for m in self.messages):
            self.messages.append(message)

    def of(self, kind) -> list:
        return [m for m in self.messages if isinstance(m, kind)]


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


def transfers(server, since: int = 0) -> list[str]:
    return [r.path for r in server.requests[since:] if "/resolve/" in r.path or "/cdn/" in r.path]


async def answer_one(pilot, app, text: str = "hello there"):
    await send(pilot, text)
    await wait_for(pilot, lambda: app.chat.last_end is not None and app.chat.turn is None, 120, "the answer")
    return app.chat.last_end


async def first_bytes(pilot, app) -> None:
    """Until the download screen shows the target GGUF (its first row) partly fetched."""

    def progressed() -> bool:
        bars = app.screen.query("#download-bar-0") if isinstance(app.screen, DownloadScreen) else []
        return bool(bars) and (bars.first().progress or 0) > 0

    await wait_for(pilot, progressed, 30, "the first bytes of the download")


async def history_still_opens(pilot, app) -> bool:
    await pilot.press("ctrl+o")
    await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "the history screen")
    await pilot.press("escape")
    await wait_for(pilot, lambda: app.screen is app.chat, 30, "the chat screen")
    return True


def test_first_run_explains_downloads_loads_and_answers(first_run, server):
    cache = first_run
    expected = hardware.choose(RTX_4090, load_catalog(), context=fast_settings().context_length)
    hook = Seen(DownloadNeeded, DownloadScreen.FileProgressed, DownloadScreen.Finished)

    async def main():
        app = start()
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            await wait_for(pilot, lambda: app.chat.backend.pair is not None, 60, "the model to load")
            await pilot.pause()
            loaded = (app.chat.backend.source, app.chat.sub_title, dict(app.chat.panel.shown), notes(app))
            end = await answer_one(pilot, app)
            return loaded, end, dict(app.chat.panel.shown)

    (source, subtitle, panel, messages), end, after = run(main())
    # the choice, explained in one line, before anything was fetched
    assert expected.pair.name == "tiny"
    assert expected.explanation.startswith("RTX 4090 24 GiB: Tiny Q8_0 + drafter Q8_0; ")
    assert messages[0] == expected.explanation
    # the download screen fetched every file of the plan into the standard cache
    [needed] = hook.of(DownloadNeeded)
    assert {f.filename for f in needed.plan.files} == {
        "Tiny-Q8_0.gguf",
        "Tiny-DFlash-q8_0.gguf",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    }
    done = {m.progress.file.filename for m in hook.of(DownloadScreen.FileProgressed) if m.progress.status == "done"}
    assert done == {f.filename for f in needed.plan.files}
    assert [m.files is not None for m in hook.of(DownloadScreen.Finished)] == [True]
    assert source.target.startswith(str(cache / "models--tiny--Tiny-GGUF" / "snapshots"))
    assert source.tokenizer.startswith(str(cache / "models--tiny--Tiny" / "snapshots"))
    # loaded on the CPU (the override), named and quantified as chosen
    assert (source.title, source.target_quant, source.drafter_quant) == ("Tiny", "Q8_0", "Q8_0")
    assert source.device == "cuda:0"  # where the choice placed it; DFLASH_CHAT_DEVICE moved it
    assert subtitle == "Tiny Q8_0 · drafter Q8_0"
    assert panel["target"] == "Tiny" and panel["quant"] == panel["drafter quant"] == "Q8_0"
    assert panel["device"].startswith("cpu") and panel["drafter"] == "Tiny-DFlash-q8_0"
    assert "Tiny Q8_0 · drafter Q8_0 is ready" in messages[-1]
    # ... and it chats, drafting with the downloaded drafter
    assert end.reason in ("length", "stop") and end.stats.speculative and end.stats.new_tokens > 0
    assert end.stats.decode_tokens_per_s > 0
    assert after["tok/s (last)"] == format_speed(end.stats.decode_tokens_per_s)


def prefetch(server) -> hub.ModelFiles:
    pair = load_catalog().get("tiny")
    return hub.fetch(pair.targets[0], pair.drafters[0], pair.tokenizer, endpoint=server.url)


@pytest.mark.parametrize("network", ["online", "offline"])
def test_a_second_start_finds_everything_cached(first_run, server, monkeypatch, network):
    files = prefetch(server)
    before = len(server.requests)
    if network == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hook = Seen(DownloadNeeded, ModelUnavailable, DownloadScreen.FileProgressed)

    async def main():
        app = start()
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            await wait_for(pilot, lambda: app.chat.backend.pair is not None or hook.messages, 60, "the model to load")
            return app.chat.backend.source, notes(app)

    source, messages = run(main())
    assert hook.messages == []  # no download screen, nothing unavailable
    assert source.target == str(files.target) and source.tokenizer == str(files.tokenizer)
    assert transfers(server, before) == []
    if network == "offline":
        assert len(server.requests) == before  # not even the listing
    assert messages[0].startswith("RTX 4090 24 GiB: Tiny Q8_0 + drafter Q8_0")


@pytest.mark.parametrize("network", ["HF_HUB_OFFLINE", "unreachable"])
def test_offline_with_nothing_cached_says_what_is_missing(first_run, server, monkeypatch, network):
    if network == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: connection refused
    hook = Seen(ModelUnavailable)

    async def main():
        app = start()
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            await wait_for(pilot, lambda: hook.messages, 30, "the verdict")
            await pilot.pause()
            usable = await history_still_opens(pilot, app)
            await send(pilot, "anyone there?")
            await pilot.pause()
            return app.chat.notice(), notes(app), usable

    notice, messages, usable = run(main())
    [verdict] = hook.messages
    error = verdict.error
    assert error.startswith("Tiny Q8_0 + drafter Q8_0 is not downloaded yet: ")
    reason = "offline (HF_HUB_OFFLINE is set)" if network == "HF_HUB_OFFLINE" else "cannot reach http://127.0.0.1:9"
    assert reason in error
    lacks = error.split(" lacks: ")[1].split(". ")[0]
    assert lacks.split("; ") == [
        "tiny/Tiny-GGUF *Q8_0*.gguf (Q8_0)",
        "tiny/Tiny-DFlash-GGUF *q8_0*.gguf (Q8_0)",
        "tiny/Tiny tokenizer_config.json",
    ]
    assert error.endswith(f"For this model: `{PULL}`.")
    assert error in messages and notice == f"No model yet: {error}"
    assert usable and messages[-1] == f"Not sent: No model yet: {error}"  # the reply to sending without a model
    assert server.requests == []


def test_escape_on_the_download_screen_keeps_the_app_usable_and_the_next_start_resumes(first_run, server):
    cache = first_run
    server.hold = threading.Event()  # the transfer stops after its first 64 KiB: Esc lands mid-file

    async def cancelled():
        app = start()
        async with app.run_test(size=(120, 36)) as pilot:
            await first_bytes(pilot, app)
            server.release_when(app.screen.cancel)
            await pilot.press("escape")
            await wait_for(
                pilot, lambda: app.screen is app.chat and "not downloaded" in app.chat.notice(), 30, "the cancel"
            )
            usable = await history_still_opens(pilot, app)
            return app.chat.notice(), notes(app), usable, app.chat.backend.pair

    notice, messages, usable, pair = run(cancelled())
    advice = f"Start dflash-chat again to resume the download, or fetch it from a terminal: `{PULL}`."
    assert "Download cancelled. The partial files are kept: start it again to resume." in messages
    assert advice in messages and advice in notice
    assert usable and pair is None
    [partial] = cache.glob("models--tiny--Tiny-GGUF/blobs/*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < len(server.repos[TARGET_REPO].files["Tiny-Q8_0.gguf"])

    before = len(server.requests)

    async def resumed():
        app = start()
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.chat.backend.pair is not None, 60, "the model to load")
            return app.chat.backend.source

    source = run(resumed())
    ranges = [r.headers.get("range") for r in server.requests[before:] if r.path.startswith("/cdn/")]
    assert f"bytes={kept}-" in ranges
    assert source.title == "Tiny"


def test_a_failing_download_says_what_happened_and_the_app_goes_on(first_run, server):
    server.busy = 1000  # every file request answers 503

    async def main():
        app = start()
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: "not downloaded" in app.chat.notice(), 30, "the failure")
            usable = await history_still_opens(pilot, app)
            return notes(app), usable

    messages, usable = run(main())
    assert any("keeps failing (HTTP 503); the partial file is kept: run again to resume" in m for m in messages)
    assert any(m.startswith("Start dflash-chat again to resume the download") and PULL in m for m in messages)
    assert usable


def test_without_a_gpu_and_without_the_demo_files_the_app_says_what_to_pass(home, monkeypatch):
    monkeypatch.setattr(hardware, "probe", lambda: NO_GPU)
    monkeypatch.setattr(demo, "demo_dir", lambda: home / "no-demo-data")  # an install without it
    hook = Seen(ModelUnavailable)

    async def main():
        app = start()
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            await wait_for(pilot, lambda: hook.messages, 30, "the verdict")
            usable = await history_still_opens(pilot, app)
            return app.chat.sub_title, usable

    subtitle, usable = run(main())
    error = hook.messages[0].error
    assert error.startswith("CPU, 16 GiB RAM: no GPU (CPU-only build of torch), and the tiny demo model is not part")
    assert "--target DIR --drafter DIR" in error and "--model NAME" in error
    assert subtitle == "no model" and usable


def test_without_a_gpu_the_demo_pair_runs_and_the_app_says_so(home, monkeypatch, tiny_pair):
    """The demo files are a stand-in here (a tiny random pair) until demo_data ships."""
    target, drafter = tiny_pair
    monkeypatch.setattr(hardware, "probe", lambda: NO_GPU)
    monkeypatch.setattr(model_source, "demo_source", lambda: ModelSource(str(target), str(drafter), demo=True))

    async def main():
        app = start()
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.chat.backend.pair is not None, 60, "the demo pair to load")
            await pilot.pause()
            return app.chat.backend.source, app.chat.notice(), app.chat.sub_title, notes(app)

    source, notice, subtitle, messages = run(main())
    assert source.demo and source.target == str(target)
    assert messages[0].startswith("CPU, 16 GiB RAM: no GPU (CPU-only build of torch), so the tiny built-in demo model")
    assert "tiny built-in demo model" in notice and subtitle == "tiny demo model"
    assert messages[-1].startswith("tiny demo model is ready")


@pytest.mark.skipif(not demo.demo_available(), reason="the demo pair is not in dflash_chat/demo_data yet")
def test_without_a_gpu_the_shipped_demo_pair_is_chosen(home, monkeypatch):
    monkeypatch.setattr(hardware, "probe", lambda: NO_GPU)
    from dflash_chat.runtime.model_manager import choose

    chosen = choose(model_source.Pick(), 1024)
    assert chosen.demo == model_source.demo_source() and chosen.choice is None


def test_quitting_mid_download_stops_the_transfer(first_run, server):
    cache = first_run
    server.hold = threading.Event()  # the transfer stops after its first 64 KiB: the quit lands mid-file

    async def main():
        app = start()
        async with app.run_test(size=(120, 36)) as pilot:
            await first_bytes(pilot, app)
            server.release_when(app.screen.cancel)
            await pilot.press("ctrl+q")

    run(main())  # returns once the worker thread has ended
    assert len(list(cache.glob("models--tiny--Tiny-GGUF/blobs/*.incomplete"))) == 1  # stopped, kept to resume
    assert not list(cache.glob("models--tiny--Tiny/blobs/*"))  # the files after it never started


def test_a_pair_named_on_the_settings_screen_goes_through_the_model_manager(first_run, server):
    from textual.widgets import Input

    from dflash_chat.ui.app import DFlashChatApp
    from dflash_chat.ui.settings_screen import SettingsScreen

    prefetch(server)

    async def main():
        app = DFlashChatApp(fast_settings())  # started without a model
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            app.screen.query_one("#field-model", Input).value = "qwen9-huge"
            await pilot.press("ctrl+s")
            await pilot.pause()
            refused = isinstance(app.screen, SettingsScreen), notes(app)[-1]
            app.screen.query_one("#field-model", Input).value = "Tiny"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.chat.backend.pair is not None, 60, "the named pair to load")
            return refused, app.chat.backend.source

    (still_open, refusal), source = run(main())
    assert still_open and refusal.startswith("Not saved: model: unknown model 'qwen9-huge'; known models: ")
    assert (source.title, source.quant_label) == ("Tiny", "Q8_0 · drafter Q8_0")
    assert settings_module.load().model == "tiny"  # saved by its catalog name


@pytest.mark.gpu
def test_on_a_real_gpu_the_probe_places_the_model_there(first_run, server, monkeypatch):
    """No double at all: torch's probe sees the GPU, the choice names it, the engine runs on it."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(hardware, "probe", REAL_PROBE)
    monkeypatch.delenv(DEVICE_ENV)
    machine = REAL_PROBE()

    async def main():
        app = start()
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.chat.backend.pair is not None, 120, "the model to load")
            end = await answer_one(pilot, app)
            return app.chat.backend.source, app.chat.backend.pair.device, notes(app), end

    source, device, messages, end = run(main())
    assert messages[0].startswith(f"{machine.label}: Tiny Q8_0 + drafter Q8_0; ")
    assert source.device == machine.device and device == torch.device(machine.device)
    assert end.stats.speculative and end.stats.new_tokens > 0 and end.stats.decode_tokens_per_s > 0


NO_TORCH_CHECK = """
import asyncio, sys
from dflash_chat import cli
from dflash_chat.models import hardware
from dflash_chat.runtime import model_source
from dflash_chat.commands.chat import build_app
from dflash_chat.settings import Settings
from dflash_chat.runtime.events import ModelUnavailable

gpu = hardware.Gpu(0, "NVIDIA GeForce RTX 3090", 24 * 2**30, 23 * 2**30)
hardware.probe = lambda: hardware.Machine((gpu,), 64 * 2**30, 48 * 2**30)
seen = []

async def main():
    app = build_app(cli.build_parser().parse_args([]), Settings())
    hook = lambda m: seen.append(m.event) if isinstance(getattr(m, "event", None), ModelUnavailable) else None
    async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
        while not seen:
            await pilot.pause(0.05)

asyncio.run(main())
print("torch" in sys.modules, "is not downloaded yet: offline" in seen[0].error)
"""


def test_the_model_managers_own_steps_import_no_torch(home, tmp_path):
    """Only the real probe (and then the loader) imports torch; choosing and planning do not."""
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH_CHECK],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DFLASH_CHAT_HOME": str(home), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]  # no torch, and it got as far as planning
