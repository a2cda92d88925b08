"""DownloadScreen under Pilot, fetching from the local Hub (tests/hubserver.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from textual.app import App
from textual.widgets import ProgressBar

from dflash_chat.models import hub
from dflash_chat.models.catalog import (
    SAFETENSORS_EXTRAS,
    SAFETENSORS_PATTERNS,
    TOKENIZER_EXTRAS,
    TOKENIZER_PATTERNS,
    Source,
)
from dflash_chat.ui.app import STYLESHEET
from dflash_chat.ui.download_screen import DownloadScreen, clock, describe
from tests.hubserver import HubServer, Repo, isolate_hub

TARGET = np.random.default_rng(3).bytes(1_000_000)


@pytest.fixture
def server():
    repos = {
        "tiny/Tiny-GGUF": Repo({"Tiny-Q4_K_M.gguf": TARGET}),
        "tiny/Tiny-DFlash": Repo({"config.json": b"{}", "model.safetensors": b"w" * 5000}),
        "tiny/Tiny": Repo({"tokenizer_config.json": b"{}"}),
    }
    with HubServer(repos) as running:
        yield running


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setattr(hub, "PROGRESS_INTERVAL", 0.0)
    return isolate_hub(monkeypatch, tmp_path)


def make_plan(server) -> hub.Plan:
    return hub.plan(
        Source("gguf", "Q4_K_M", "tiny/Tiny-GGUF", patterns=("*Q4_K_M*.gguf",)),
        Source("safetensors", "BF16", "tiny/Tiny-DFlash", patterns=SAFETENSORS_PATTERNS, extras=SAFETENSORS_EXTRAS),
        Source("tokenizer", repo="tiny/Tiny", patterns=TOKENIZER_PATTERNS, extras=TOKENIZER_EXTRAS),
        endpoint=server.url,
    )


class Host(App):
    """Pushes the screen at start and keeps what it dismissed with."""

    CSS_PATH = STYLESHEET  # the app's look

    def __init__(self, screen: DownloadScreen) -> None:
        super().__init__()
        self.download = screen
        self.result: object = "pending"

    def on_mount(self) -> None:
        self.push_screen(self.download, callback=self._done)

    def _done(self, result) -> None:
        self.result = result


async def until(pilot, condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


def test_bars_advance_and_the_screen_returns_the_paths(server, cache):
    server.hold = threading.Event()  # the target stops after its first piece until the bar has shown it
    app = Host(DownloadScreen(make_plan(server)))

    async def scenario():
        async with app.run_test() as pilot:
            seen: list[float] = []
            deadline = time.monotonic() + 60
            while app.result == "pending":
                if app.screen is app.download:
                    bar = app.download.query_one("#download-bar-0", ProgressBar)
                    seen.append(bar.progress)
                    if 0 < (bar.progress or 0) < len(TARGET):
                        server.hold.set()
                await pilot.pause(0.02)
                assert time.monotonic() < deadline, "download never finished"
            return seen

    seen = asyncio.run(scenario())
    assert any(0 < value < len(TARGET) for value in seen)  # shown mid-file
    assert seen == sorted(seen)
    files = app.result
    assert isinstance(files, hub.ModelFiles)
    assert files.target.read_bytes() == TARGET
    assert (files.drafter / "model.safetensors").exists() and (files.tokenizer / "tokenizer_config.json").exists()


def test_escape_cancels_and_keeps_the_partial_file(server, cache):
    server.hold = threading.Event()  # the target stops after its first piece: Esc lands mid-file
    app = Host(DownloadScreen(make_plan(server)))

    async def scenario():
        async with app.run_test() as pilot:
            bar = app.download.query_one("#download-bar-0", ProgressBar)
            await until(pilot, lambda: (bar.progress or 0) > 0, "the first bytes")
            server.release_when(app.download.cancel)
            await pilot.press("escape")
            await until(pilot, lambda: app.result != "pending", "the cancel")
            return notes(app)

    messages = asyncio.run(scenario())
    assert app.result is None
    assert messages == ["Download cancelled. The partial files are kept: start it again to resume."]
    partial = list(cache.glob("models--tiny--Tiny-GGUF/blobs/*.incomplete"))
    assert len(partial) == 1 and 0 < partial[0].stat().st_size < len(TARGET)


def test_a_failure_dismisses_with_none_and_says_what_to_do(server, cache):
    app = Host(DownloadScreen(make_plan(server), disk_free=lambda path: 10))

    async def scenario():
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.result != "pending", "the failure")
            return notes(app)

    messages = asyncio.run(scenario())
    assert app.result is None
    assert len(messages) == 1 and messages[0].startswith("not enough disk space in ")
    assert "HF_HUB_CACHE" in messages[0]


def test_progress_text():
    file = hub.RemoteFile("target", "r/x", "x.gguf", "c" * 40, 16_500_000_000)
    text = describe(hub.Progress(file, 10**9, 16_500_000_000, speed=50 * 10**6, eta=310))
    assert text == "1 GB / 16.5 GB · 50 MB/s · 5:10 left"  # the Hub's units: the file page says 16.5 GB
    assert describe(hub.Progress(file, 0, 16_500_000_000)) == "0 B / 16.5 GB · 0 B/s"
    assert describe(hub.Progress(file, 16_500_000_000, 16_500_000_000, status="done")) == "16.5 GB · done"
    assert clock(3725) == "1:02:05"
