"""The chat app on a remote engine (Pilot): against a live `serve` on loopback the answer streams and
the panel shows the server's own acceptance; against a vLLM stand-in it shows the acceptance computed
from vLLM's /metrics counters (or llama.cpp's timings), and says so, or that the server reports none."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from dflash_chat import paths
from dflash_chat.chat.backends.remote import HttpBackend
from dflash_chat.chat.conversation import CANCELLED, COMPLETE
from dflash_chat.chat.history import HistoryStore
from dflash_chat.runtime.bridge import StreamChunk
from dflash_chat.runtime.endpoint import Endpoint
from dflash_chat.runtime.events import ModelUnavailable
from dflash_chat.runtime.openai_protocol import COUNTERS, PER_REQUEST, TIMINGS
from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.widgets.stats_panel import DASH, NO_FIGURES, format_rate, format_speed
from tests.ui.conftest import wait_for

from . import stub_vllm
from .conftest import Answers, Paced, serving
from .stub_vllm import StubServer

SETTINGS = Settings(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=16)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class Seen:
    def __init__(self, kind) -> None:
        self.kind = kind
        self.events = []

    def __call__(self, message) -> None:
        event = getattr(message, "event", None)
        if isinstance(event, self.kind) and not any(e is event for e in self.events):
            self.events.append(event)


async def ask(pilot, app, text: str):
    before = app.chat.last_end
    await pilot.press(*text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.chat.turn is None and app.chat.last_end is not before, 60, "the answer")
    return app.chat.last_end


def remote_app(url: str, settings: Settings = SETTINGS, api_key: str | None = None) -> DFlashChatApp:
    return DFlashChatApp(settings, backend=HttpBackend(Endpoint.of(url, api_key)))


def test_against_serve_the_answer_streams_and_the_panel_shows_the_servers_acceptance(home, demo_pair, monkeypatch):
    answers = Answers(demo_pair, monkeypatch)
    hook = Seen(StreamChunk)
    with serving(demo_pair) as (served, url):

        async def main():
            app = remote_app(f"{url}/v1")
            async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
                await wait_for(pilot, lambda: app.chat.backend.model is not None, 30, "the connection")
                end = await ask(pilot, app, "What does the with statement do?")
                await pilot.pause()
                shown, chunks = dict(app.chat.panel.shown), list(hook.events)
                await pilot.press("ctrl+t")  # thinking on, then the same question again
                await pilot.press("ctrl+r")
                await wait_for(pilot, lambda: app.chat.turn is None and app.chat.last_end is not end, 60, "answer 2")
                return end, shown, chunks, app.chat.last_end, app.chat.sub_title

        end, shown, chunks, thinking, subtitle = asyncio.run(main())
        first, second = [r.stats for r in answers]
    assert end.reason == "length" and end.answer and end.error is None
    assert chunks and "".join(c.answer for c in chunks) == end.answer  # streamed, in pieces
    # the server's own figures for this answer, and where they came from
    assert shown["acceptance"] == format_rate(first.acceptance_rate)
    assert shown["tokens/step"] == f"{first.mean_acceptance_length:.2f}"
    assert shown["from"] == PER_REQUEST
    assert shown["drafts/step"] == f"auto · {first.mean_draft_length:.1f}"  # the server's setting, as it says
    assert shown["new"] == str(first.new_tokens) == "16"
    assert shown["prompt"] == f"{first.prompt_tokens} ({first.reused_tokens} reused)"
    # speed and first token measured here, on the client
    assert shown["tok/s (last)"] == format_speed(end.stats.decode_tokens_per_s) and end.stats.decode_tokens_per_s > 0
    assert shown["first token"] != DASH and end.stats.ttft_s >= first.ttft_s
    assert shown["model"] == "dflash-chat-demo" and shown["server"] == url.removeprefix("http://")
    assert subtitle == f"dflash-chat-demo @ {url.removeprefix('http://')}"
    # the thinking switch reaches the server: the demo model thinks, and that text is the thinking
    assert thinking.thinking and second.prompt_tokens != first.prompt_tokens
    saved = HistoryStore(paths.history_db()).load(1).messages
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].status == COMPLETE and saved[1].stats.accepted == second.accepted


def test_escape_stops_a_remote_answer_and_the_server_frees_its_engine(home, demo_pair, monkeypatch):
    Paced(demo_pair, monkeypatch)  # the server's engine waits after each step until the answer is cancelled
    answers = Answers(demo_pair, monkeypatch)
    with serving(demo_pair) as (served, url):

        async def main():
            app = remote_app(url, replace(SETTINGS, max_new_tokens=400))
            async with app.run_test(size=(120, 36)) as pilot:
                await wait_for(pilot, lambda: app.chat.backend.model is not None, 30, "the connection")
                await pilot.press(*"tell me a long story")
                await pilot.press("enter")
                await wait_for(
                    pilot,
                    lambda: app.chat.turn is not None and app.chat.turn.message.content,
                    60,
                    "the first streamed text",
                )
                await pilot.press("escape")  # the engine is held mid-answer: only the cut connection can end it
                await wait_for(pilot, lambda: app.chat.turn is None, 30, "the answer to stop")
                return app.chat.last_end

        end = asyncio.run(main())
        assert served.scheduler.wait_idle(30)
        record = answers[-1]
    assert end.reason == "cancelled" and end.answer
    assert record.reason == "cancelled" and record.steps_after_cancel <= 1 and record.new_tokens < 400
    saved = HistoryStore(paths.history_db()).load(1).messages[-1]
    assert saved.status == CANCELLED and saved.content == end.answer


@pytest.mark.parametrize(
    "mode, source, acceptance, per_step, drafts",
    [
        ("counters", COUNTERS, sum(stub_vllm.PER_POSITION) / 150, (stub_vllm.COMPLETION_TOKENS - 1) / 10, "15.0"),
        (
            "timings",
            TIMINGS,
            60 / 96,
            (stub_vllm.COMPLETION_TOKENS - 1) / (stub_vllm.COMPLETION_TOKENS - 60 - 1),
            f"{96 / (stub_vllm.COMPLETION_TOKENS - 60 - 1):.1f}",
        ),
        ("none", NO_FIGURES, None, None, DASH),
    ],
)
def test_against_a_vllm_stand_in_the_panel_shows_what_the_server_reports(
    home, mode, source, acceptance, per_step, drafts
):
    with StubServer(mode) as stub:

        async def main():
            app = remote_app(stub.url)
            async with app.run_test(size=(120, 36)) as pilot:
                await wait_for(pilot, lambda: app.chat.backend.model is not None, 30, "the connection")
                await ask(pilot, app, "What does with do?")
                await pilot.pause()
                first = dict(app.chat.panel.shown)
                await pilot.press("ctrl+t")
                end = await ask(pilot, app, "And again, thinking?")
                await pilot.pause()
                return first, dict(app.chat.panel.shown), end, str(app.chat.panel.query_one("#histogram").render())

        shown, again, end, histogram = asyncio.run(main())
        bodies = stub.bodies
    assert shown["from"] == again["from"] == source
    if acceptance is None:
        assert shown["acceptance"] == shown["tokens/step"] == DASH
    else:
        assert shown["acceptance"] == again["acceptance"] == format_rate(acceptance)
        assert shown["tokens/step"] == f"{per_step:.2f}"
    assert shown["drafts/step"] == drafts  # from its figures; vLLM does not say a draft setting
    if mode == "counters":  # per-position counters give the whole histogram
        assert histogram.startswith("accepted/step\n") and len(histogram) == len("accepted/step\n") + 16
    assert shown["new"] == str(stub_vllm.COMPLETION_TOKENS) and shown["model"] == stub_vllm.MODEL
    assert shown["runs"] == "vllm"
    assert end.answer == "".join(stub_vllm.ANSWER) and end.thinking == "".join(stub_vllm.THINKING)
    assert [b["chat_template_kwargs"]["enable_thinking"] for b in bodies] == [False, True]
    assert bodies[0]["stream"] is True and bodies[0]["stream_options"]["include_usage"] is True
    assert bodies[0]["max_tokens"] == SETTINGS.max_new_tokens and bodies[0]["model"] == stub_vllm.MODEL


def test_an_unreachable_server_or_a_wrong_key_is_said_and_the_app_stays_usable(home, demo_pair):
    hook = Seen(ModelUnavailable)

    async def main(app):
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            await wait_for(pilot, lambda: hook.events, 30, "the verdict")
            await pilot.press(*"anyone?")
            await pilot.press("enter")
            await pilot.pause()
            return app.chat.notice(), [n.message for n in app._notifications], app.chat.sub_title

    notice, notes, subtitle = asyncio.run(main(remote_app("http://127.0.0.1:9/v1")))
    assert "cannot reach http://127.0.0.1:9/v1" in hook.events[0].error and subtitle == "no model"
    assert notice == f"No model yet: {hook.events[0].error}" and "Traceback" not in notice
    with serving(demo_pair, api_key="right") as (_, url):
        notice, notes, _ = asyncio.run(main(remote_app(url, api_key="wrong")))
    assert "refused the API key" in notice and "--api-key" in notice


NO_TORCH = """
import asyncio, sys, time
from dflash_chat import cli
from dflash_chat.commands.chat import build_app
from dflash_chat.settings import Settings

async def main():
    app = build_app(cli.build_parser().parse_args(["--endpoint", sys.argv[1]]), Settings())
    async with app.run_test(size=(120, 36)) as pilot:
        deadline = time.monotonic() + 60
        while app.chat.backend.model is None and time.monotonic() < deadline:
            await pilot.pause(0.02)
        await pilot.press(*"hello")
        await pilot.press("enter")
        while (app.chat.turn is not None or app.chat.last_end is None) and time.monotonic() < deadline:
            await pilot.pause(0.02)
        return app.chat.last_end.answer

answer = asyncio.run(main())
print("torch" in sys.modules, repr(answer))
"""


def test_the_app_on_an_endpoint_never_imports_torch(home, tmp_path):
    with StubServer("counters") as stub:
        result = subprocess.run(
            [sys.executable, "-c", NO_TORCH, stub.url],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "DFLASH_CHAT_HOME": str(tmp_path)},
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 1) == ["False", repr("".join(stub_vllm.ANSWER)) + "\n"]
