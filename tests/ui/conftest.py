from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import replace

import pytest

from dflash_chat import paths
from dflash_chat.chat.conversation import Message
from dflash_chat.chat.history import HistoryStore
from dflash_chat.engine.events import GenerationStats
from dflash_chat.settings import Settings

GRAPHICS_ENV = ("KITTY_WINDOW_ID", "TERM_PROGRAM", "LC_TERMINAL", "MLTERM", "TERMINAL_NAME", "KONSOLE_VERSION")


@pytest.fixture(autouse=True)
def plain_terminal(monkeypatch):
    """Tests see a terminal that draws no images, whichever one runs them (ui/terminal_graphics.py reads these), so
    the image previews are half-blocks, as the snapshots hold them."""
    for name in GRAPHICS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield tmp_path / "home"
    monkeypatch.undo()
    time.tzset()


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    from tests.engine.tiny import write_pair

    return write_pair(tmp_path_factory.mktemp("tiny-pair"), seed=0)


def fast_settings(**changes) -> Settings:
    """Greedy and short, so each Pilot test generates only a few tokens."""
    return replace(Settings(temperature=0.0, max_new_tokens=6, context_length=1024), **changes)


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def send(pilot, text: str) -> None:
    await pilot.press(*text)
    await pilot.press("enter")


async def loaded(pilot, app, what: str = "the model to load") -> None:
    await wait_for(pilot, lambda: app.chat.backend.pair is not None, 60, what)


async def answered(pilot, app, count: int) -> None:
    """Wait for the model, then until no answer streams and the chat holds `count` finished answers."""
    await loaded(pilot, app)
    await wait_for(
        pilot,
        lambda: (
            app.chat.turn is None
            and sum(1 for m in app.chat.conversation.messages if m.role == "assistant" and m.status != "partial")
            >= count
        ),
        120,
        f"answer {count}",
    )


async def ask(pilot, app, text: str, count: int) -> None:
    """Once the model is loaded, send `text` and wait for the chat's `count`th finished answer."""
    await loaded(pilot, app)
    await send(pilot, text)
    await answered(pilot, app, count)


STATS = GenerationStats(
    prompt_tokens=42,
    reused_tokens=17,
    new_tokens=61,
    steps=12,
    drafted=180,
    accepted=48,
    acceptance_histogram=[2, 1, 0, 3, 2, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1],
    draft_histogram=[0] * 15 + [12],
    draft="auto",  # every step verified 15 drafts
    prefill_s=0.05,
    ttft_s=0.08,
    decode_s=0.5,
    speculative=True,
)

ANSWER = """The `with` statement runs a block inside a *context manager*:

```python
with open("notes.txt") as handle:
    text = handle.read()
```

The file is closed when the block ends, even after an error."""


def seed_history(path) -> int:
    """A fixed conversation (fixed clock, fixed stats) for snapshots and history tests."""
    clock = itertools.count(1_767_225_600, 60)  # 2026-01-01 00:00 UTC, a minute per write
    store = HistoryStore(path, clock=lambda: float(next(clock)))
    older = store.create("Sorting a dict by value")
    store.add(older, Message("user", "How do I sort a dict by value?"))
    store.add(older, Message("assistant", "Use `sorted(d.items(), key=lambda kv: kv[1])`."))
    cid = store.create("What does with do?")
    store.add(cid, Message("user", "What does the `with` statement do in Python?"))
    store.add(cid, Message("assistant", ANSWER, thinking="Explain context managers; show a file example.", stats=STATS))
    store.close()
    return cid


def run(coro):
    return asyncio.run(coro)


def write_config(text: str):
    """The user's config.toml as they wrote it (mode 644, as an editor leaves it)."""
    config = paths.config_file()
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    config.chmod(0o644)
    return config


CELL_WIDTH = 12.2  # pixels of a terminal column in Textual's SVG screenshots


def screen_lines(app) -> list[str]:
    """The screen as text, a line per terminal row (from the SVG screenshot: a text element per styled run)."""
    import html
    import re
    from collections import defaultdict

    svg = app.export_screenshot()
    rows: dict[float, list[tuple[float, str]]] = defaultdict(list)
    for x, y, text in re.findall(r'<text[^>]*?x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg):
        rows[float(y)].append((float(x), html.unescape(text).replace("\xa0", " ")))
    lines = []
    for y in sorted(rows):
        line = ""
        for x, text in sorted(rows[y]):
            line = line.ljust(round(x / CELL_WIDTH)) + text
        lines.append(line)
    return lines


def answer_ended(panel) -> None:
    """The panel as an answer with every drafting method leaves it, after one answer with thinking off and one
    with it on, beside a catalog pair's model rows (the longest the panel shows)."""
    from dflash_chat.engine.events import MethodStats

    def stats(accepted: int):
        figures = replace(STATS, accepted=accepted)
        figures.methods = {
            "dflash": MethodStats(10, 150, 40),
            "mtp": MethodStats(1, 3, 1),
            "lookup": MethodStats(1, 15, 7),
        }
        return figures

    panel.show_final(stats(48), thinking=False)
    panel.show_final(stats(90), thinking=True)
    panel.show_model(
        (
            ("target", "Qwen3.6-27B"),
            ("drafter", "Qwen3.6-27B-DFlash"),
            ("quant", "Q4_K_M"),
            ("drafter quant", "Q8_0"),
            ("device", "cuda:0 · bfloat16"),
            ("VRAM", "21.3 GB / 24.0 GB"),
        )
    )
