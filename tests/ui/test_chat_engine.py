"""Pilot tests on the REAL engine with a tiny random pair (its text is gibberish; the
assertions are on structure and on the engine's own GenerationStats)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from dflash_chat import paths
from dflash_chat.chat.conversation import CANCELLED, COMPLETE, PARTIAL
from dflash_chat.chat.events import PromptSent
from dflash_chat.chat.history import HistoryStore
from dflash_chat.models.demo import demo_available
from dflash_chat.runtime.bridge import StreamChunk
from dflash_chat.runtime.events import ModelLoaded
from dflash_chat.runtime.model_source import ModelSource, demo_source
from dflash_chat.ui import chat_screen
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.history_screen import HistoryScreen
from dflash_chat.ui.widgets.chat_view import AssistantMessage, Notice, UserMessage
from dflash_chat.ui.widgets.stats_panel import format_rate, format_seconds, format_speed
from tests.pacing import after_each_step

from .conftest import answered, ask, fast_settings, loaded, run, send, wait_for


class Seen:
    """Backend events of one type, each once (the hook sees a message at every node it bubbles
    through); holding them keeps their ids from being reused."""

    def __init__(self, kind) -> None:
        self.kind = kind
        self.messages = []

    def __call__(self, message) -> None:
        event = getattr(message, "event", None)
        if isinstance(event, self.kind) and not any(m is event for m in self.messages):
            self.messages.append(event)


class Paced:
    """The loaded pair's real engine, one step at a time: after each step it waits until the test
    lets the next one run (or the answer is cancelled). A test that must act while an answer streams
    then never misses that state, however fast or slow the machine is."""

    def __init__(self, pair) -> None:
        self.waiting = threading.Event()  # a step is done and the next one waits for `go`
        self.go = threading.Event()
        pair.engine.generate = after_each_step(pair.engine.generate, self._hold)

    def _hold(self, cancel) -> None:
        self.waiting.set()
        while not self.go.wait(0.02) and not (cancel is not None and cancel.is_set()):
            pass
        self.go.clear()
        self.waiting.clear()

    async def until(self, pilot, condition, what: str, timeout: float = 60.0) -> None:
        """Let the answer go on a step at a time until `condition()` holds."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            if self.waiting.is_set():
                self.go.set()
            await pilot.pause(0.02)


def make_app(tiny_pair, **settings):
    target, drafter = tiny_pair
    return DFlashChatApp(fast_settings(**settings), ModelSource(str(target), str(drafter)))


def test_a_message_gets_a_streamed_answer_and_the_engines_figures(home, tiny_pair):
    hook = Seen(StreamChunk)

    async def main():
        app = make_app(tiny_pair, max_new_tokens=8, draft=4)  # a fixed draft length: the same steps alone
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            await ask(pilot, app, "hello there", 1)
            await pilot.pause()
            widget = app.chat.query(AssistantMessage).last()
            return (
                app.chat.last_end,
                app.chat.last_prompt,
                dict(app.chat.panel.shown),
                len(app.chat.query(UserMessage)),
                widget.answer.source,
            )

    end, prompt, shown, users, rendered = run(main())
    stats = end.stats
    assert end.reason == "length" and stats.new_tokens == 8 and stats.speculative
    assert users == 1
    # streamed: at most one batch per engine event (Prefilled, the first token, each step);
    # here a CPU step outlasts the 40 ms batch window, test_bridge covers the fast case
    streamed = list(hook.messages)
    assert 2 <= len(streamed) <= stats.steps + 2
    assert "".join(c.thinking for c in streamed) == end.thinking
    assert "".join(c.answer for c in streamed) == end.answer == rendered
    # the panel shows the engine's own figures
    assert stats.decode_tokens_per_s > 0
    assert shown["tok/s (last)"] == format_speed(stats.decode_tokens_per_s)
    assert shown["acceptance"] == format_rate(stats.acceptance_rate)
    assert shown["tokens/step"] == f"{stats.mean_acceptance_length:.2f}"
    assert shown["drafts/step"] == f"4 · {stats.mean_draft_length:.1f}" and stats.draft == "4"
    assert shown["new"] == "8" and shown["prompt"] == f"{len(prompt.ids)} (0 reused)"
    assert shown["drafter"] == "drafter" and shown["target"] == "target"
    assert shown["RAM"].endswith("GB")
    # ... and they are what the engine reports for this prompt when run on its own
    from dflash_chat.engine.load import load_pair
    from dflash_chat.engine.sampling_params import SamplingParams

    pair = load_pair(*tiny_pair, max_context=1024, draft=4)
    params = SamplingParams(max_new_tokens=8)  # greedy, as the app's; the engine stops at the model's end ids
    alone = list(pair.engine.generate(prompt.ids, params, threading.Event()))[-1].stats
    assert (alone.new_tokens, alone.steps, alone.drafted, alone.accepted, alone.draft_histogram) == (
        stats.new_tokens,
        stats.steps,
        stats.drafted,
        stats.accepted,
        stats.draft_histogram,
    )
    # saved as complete, with its stats
    saved = HistoryStore(paths.history_db()).load(1).messages
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].status == COMPLETE and saved[1].content == end.answer
    assert saved[1].stats.new_tokens == 8


def test_the_panel_shows_the_draft_length_and_a_new_draft_setting_reaches_the_engine_next_answer(home, tiny_pair):
    from textual.widgets import Input

    from dflash_chat import settings as settings_module
    from dflash_chat.ui.settings_screen import SettingsScreen

    hook = Seen(StreamChunk)
    set_in: list[str] = []

    async def main():
        app = make_app(tiny_pair, max_new_tokens=8)  # draft auto, the default
        async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
            await loaded(pilot, app)
            engine = app.chat.backend.pair.engine
            real_set = engine.set_draft
            engine.set_draft = lambda value: (set_in.append(threading.current_thread().name), real_set(value))
            unpaced = engine.generate
            paced = Paced(app.chat.backend.pair)
            await send(pilot, "hello there")
            await paced.until(pilot, lambda: " · " in app.chat.panel.shown["drafts/step"], "a decode step's figures")
            # the hook sees a chunk before the screen handles it: the panel shows one of those seen so far
            during = app.chat.panel.shown["drafts/step"]
            shown = [m.live for m in hook.messages if during == f"{m.live.draft} · {m.live.last_drafted}"]
            live = shown[-1] if shown else None
            await paced.until(pilot, lambda: "tok/s (last)" in app.chat.panel.shown, "the answer's own figures")
            first, after_first = app.chat.last_end.stats, dict(app.chat.panel.shown)
            # the settings screen, mid-chat: 2 drafts per step from the next answer on
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            app.screen.query_one("#field-draft", Input).value = "2"
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to the chat")
            between = (engine.draft, list(set_in))
            engine.generate = unpaced  # the next answer runs freely
            await ask(pilot, app, "again", 2)
            await wait_for(pilot, lambda: "tok/s (last)" in app.chat.panel.shown, 30, "its own figures")
            return during, live, first, after_first, between, app.chat.last_end.stats, dict(app.chat.panel.shown)

    during, live, first, after_first, between, second, after_second = run(main())
    # while it streams: the setting and the drafts the latest step verified, one `auto` chose
    assert live is not None, f"the panel shows {during!r}, which no chunk carried"
    assert live.draft == "auto" and during == f"auto · {live.last_drafted}"
    assert first.draft_histogram[live.last_drafted] > 0
    # after it: the engine's own mean
    assert first.draft == "auto" and after_first["drafts/step"] == f"auto · {first.mean_draft_length:.1f}"
    # saved, and not applied on the UI thread: the next answer's worker sets it before it starts
    assert settings_module.load().draft == 2 and between == ("auto", [])
    assert len(set_in) == 1 and set_in[0] != threading.main_thread().name
    used = [k for k, steps in enumerate(second.draft_histogram) if steps]
    assert second.draft == "2" and max(used) == 2 and second.drafted <= 2 * second.steps
    # the draft setting changes neither the prompt nor the model: the next turn reuses the first one's tokens
    assert second.reused_tokens >= first.prompt_tokens
    assert after_second["drafts/step"] == f"2 · {second.mean_draft_length:.1f}"


def test_each_chat_and_thinking_setting_keeps_its_own_draft_memory(home, tiny_pair):
    memories = []

    async def main():
        app = make_app(tiny_pair, max_new_tokens=2)
        async with app.run_test(size=(120, 36)) as pilot:
            await loaded(pilot, app)
            engine = app.chat.backend.pair.engine
            real = engine.generate

            def generate(prompt_ids, params, cancel=None, *, memory=None, **keys):
                memories.append(memory)
                return real(prompt_ids, params, cancel, memory=memory, **keys)

            engine.generate = generate
            await ask(pilot, app, "one", 1)
            await ask(pilot, app, "two", 2)
            await pilot.press("ctrl+t")  # thinking on
            await ask(pilot, app, "three", 3)
            await pilot.press("ctrl+n")  # a new chat, thinking still on
            await ask(pilot, app, "four", 1)
            await app.chat.open_conversation(1)  # back to the first chat
            await ask(pilot, app, "five", 4)
            return memories, app.chat.backend.service.records

    memories, records = run(main())
    one, two, three, four, five = memories
    assert one is two  # a chat's turns share one memory
    assert three is not one  # ... per thinking setting
    assert four is not three and all(five is not m for m in (one, three, four))  # a new chat, or one opened again
    assert all(m.records is records for m in memories)  # every chat starts from the drafter's records


def test_toggling_thinking_changes_the_prompt_the_engine_gets(home, tiny_pair):
    hook = Seen(PromptSent)

    async def main():
        app = make_app(tiny_pair, max_new_tokens=2)
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            await ask(pilot, app, "hi", 1)
            await pilot.press("ctrl+t")
            switch_on = app.chat.panel.query_one("#thinking-switch").value
            await pilot.press("ctrl+r")  # the same conversation again, thinking on
            await answered(pilot, app, 1)
            await wait_for(pilot, lambda: len(hook.messages) == 2, 10, "second prompt")
            return switch_on, [m.prompt for m in hook.messages], app.chat.backend.pair.tokenizer

    switch_on, (off, on), tokenizer = run(main())
    assert switch_on is True
    assert (off.thinking, on.thinking) == (False, True)
    assert off.ids != on.ids and on.ids == off.ids[: len(on.ids)]
    close = tokenizer.convert_tokens_to_ids("</think>")
    assert close in off.ids[len(on.ids) :] and close not in on.ids
    assert on.opens_thinking and not off.opens_thinking


def test_escape_stops_mid_answer_and_keeps_the_partial_answer(home, tiny_pair, monkeypatch):
    monkeypatch.setattr(chat_screen, "SAVE_EVERY_S", 0.0)  # every chunk saved: no wait for the clock

    async def main():
        app = make_app(tiny_pair, max_new_tokens=400)
        async with app.run_test(size=(120, 36)) as pilot:
            await loaded(pilot, app)
            paced = Paced(app.chat.backend.pair)
            await send(pilot, "tell me a long story")
            await paced.until(
                pilot, lambda: app.chat.turn is not None and app.chat.turn.message.content, "the first streamed text"
            )
            # while it streams, the answer so far is already on disk, marked partial (what a crash keeps)
            during = HistoryStore(paths.history_db()).load(1).messages[-1]
            await pilot.press("escape")
            await answered(pilot, app, 1)
            await pilot.pause()
            widget = app.chat.query(AssistantMessage).last()
            return app.chat.last_end, str(widget.query_one(".status").render()), during

    end, status, during = run(main())
    assert during.status == PARTIAL and during.content and end.answer.startswith(during.content)
    assert end.reason == "cancelled"
    assert 0 < end.stats.new_tokens < 400
    assert "stopped" in status
    saved = HistoryStore(paths.history_db()).load(1).messages[-1]
    assert saved.status == CANCELLED and saved.content == end.answer and saved.content


def test_the_next_turn_reuses_the_engines_prefix(home, tiny_pair):
    async def main():
        app = make_app(tiny_pair, max_new_tokens=3)
        async with app.run_test(size=(120, 36)) as pilot:
            await ask(pilot, app, "first", 1)
            first = app.chat.last_end.stats
            await ask(pilot, app, "second", 2)
            second, shown = app.chat.last_end.stats, app.chat.panel.shown["prompt"]
            # leave the chat and come back to it from the history: still reused
            await pilot.press("ctrl+n")
            await app.chat.open_conversation(1)
            await ask(pilot, app, "third", 3)
            return first, second, shown, app.chat.last_end.stats

    first, second, shown, third = run(main())
    # everything the engine held after the answer (its prompt and all but the newest token)
    assert second.reused_tokens == first.prompt_tokens + first.new_tokens - 1
    assert shown == f"{second.prompt_tokens} ({second.reused_tokens} reused)"
    assert third.reused_tokens == second.prompt_tokens + second.new_tokens - 1


def test_a_restarted_app_finds_the_conversation(home, tiny_pair):
    async def first_run():
        app = make_app(tiny_pair, max_new_tokens=3)
        async with app.run_test(size=(120, 36)) as pilot:
            await ask(pilot, app, "remember me", 1)
            return app.chat.conversation.messages[-1].content

    async def second_run():
        app = DFlashChatApp(fast_settings())  # no model needed to read the history
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "history screen")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.screen is app.chat and app.chat.conversation.id, 30, "chat")
            await pilot.pause()
            return (
                [w.text for w in app.chat.query(UserMessage)],
                [m.content for m in app.chat.conversation.messages],
                app.chat.conversation.title,
            )

    answer = run(first_run())
    users, contents, title = run(second_run())
    assert users == ["remember me"] and title == "remember me"
    assert contents == ["remember me", answer]


@pytest.mark.skipif(not demo_available(), reason="the trained demo pair is not in dflash_chat/demo_data yet")
def test_the_demo_pair_drafts_tokens_that_are_accepted(home):
    """On the trained demo pair the acceptance figure is not zero, and the panel shows the engine's."""

    async def main():
        app = DFlashChatApp(fast_settings(max_new_tokens=24), demo_source())
        async with app.run_test(size=(120, 36)) as pilot:
            await loaded(pilot, app, "the demo pair to load")

            def notice():  # posted just after the pair is set: wait for it rather than race it
                return " ".join(str(n.render()) for n in app.chat.query(Notice))

            await wait_for(pilot, lambda: "tiny built-in demo model" in notice(), 30, "the demo notice")
            said = notice()
            await ask(pilot, app, "What does the with statement do?", 1)
            first = app.chat.last_end.stats, dict(app.chat.panel.shown)
            await pilot.press("ctrl+r")  # the same prompt again: the engine holds all of it
            await wait_for(pilot, lambda: app.chat.last_end.stats is not first[0], 60, "the regenerated answer")
            await answered(pilot, app, 1)
            return said, first, (app.chat.last_end.stats, dict(app.chat.panel.shown))

    notice, (stats, shown), (again, regenerated) = run(main())
    assert "tiny built-in demo model" in notice
    assert stats.accepted > 0
    assert shown["acceptance"] == format_rate(stats.acceptance_rate)
    assert shown["tokens/step"] == f"{stats.mean_acceptance_length:.2f}"
    assert (shown["target"], shown["drafter"]) == ("tiny demo model", "DFlash2 (demo)")  # not the folders' names
    # a first token from a prompt held whole takes well under 10 ms: said as such, not as "0.00 s"
    assert regenerated["first token"] == format_seconds(again.ttft_s) and regenerated["first token"] != "0.00 s"


@pytest.mark.skipif(not demo_available(), reason="the trained demo pair is not in dflash_chat/demo_data yet")
def test_a_message_sent_while_the_model_loads_is_shown_at_once_and_answered_once_it_is_ready(home, monkeypatch):
    """A new user's first message, typed while the demo loads, beside the notice of a value in config.toml the
    app cannot use: it was kept in the box under a toast that read like progress, and never shown."""
    from dflash_chat import settings as settings_module
    from dflash_chat.engine import load

    from .conftest import write_config

    write_config('temperature = "hot"\nmax_new_tokens = 8\n')
    current, problems = settings_module.read()
    typed, real_load = threading.Event(), load.load_pair

    def load_after_typing(*args, **kwargs):  # the real load, once the message is in: a load as slow as a user's
        typed.wait(60)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(load, "load_pair", load_after_typing)

    async def main():
        app = DFlashChatApp(current, demo_source(), problems=problems)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.chat.backend.status.stage == "loading", 30, "the load to start")
            await send(pilot, "hello")
            await pilot.pause()
            shown = [str(w.render()) for w in app.chat.query(UserMessage)], app.chat.backend.model is None
            notes = [n.message for n in app._notifications]
            typed.set()
            await answered(pilot, app, 1)
            return shown, [(m.role, m.status) for m in app.chat.conversation.messages], notes

    (users, while_loading), turns, notes = run(main())
    assert while_loading and len(users) == 1  # shown at once, before the model was ready
    assert turns == [("user", COMPLETE), ("assistant", COMPLETE)]
    assert any(n.startswith("Sent once the model is ready.") for n in notes)
    assert any("temperature must be a number" in n for n in notes)


def test_an_engine_error_is_a_notification_and_the_chat_goes_on(home, tiny_pair):
    async def main():
        app = make_app(tiny_pair, context_length=256, max_new_tokens=250)
        async with app.run_test(size=(120, 36)) as pilot:
            await ask(pilot, app, "this prompt and 250 new tokens do not fit in 256", 1)
            await pilot.pause()
            status = str(app.chat.query(AssistantMessage).last().query_one(".status").render())
            messages = [n.message for n in app._notifications]
            # still usable: a shorter answer fits
            app.chat.settings = fast_settings(context_length=256, max_new_tokens=2)
            await ask(pilot, app, "short", 2)
            return status, messages, app.chat.last_end

    status, messages, end = run(main())
    assert "failed" in status and "256-token context" in status
    assert any("256-token context" in m and "Traceback" not in m for m in messages)
    assert end.reason in ("length", "stop") and end.stats.new_tokens >= 1
    saved = HistoryStore(paths.history_db()).load(1).messages
    assert [m.status for m in saved if m.role == "assistant"] == ["error", "complete"]


def test_choosing_a_model_on_the_settings_screen_loads_it(home, tiny_pair):
    from textual.widgets import Input

    from dflash_chat import settings as settings_module
    from dflash_chat.ui.settings_screen import SettingsScreen

    target, drafter = tiny_pair

    async def main():
        app = DFlashChatApp(fast_settings())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
            app.screen.query_one("#field-model", Input).value = str(target)
            app.screen.query_one("#field-drafter", Input).value = str(drafter)
            await pilot.press("ctrl+s")
            await loaded(pilot, app, "the chosen model to load")
            return app.chat.sub_title, dict(app.chat.panel.shown)

    subtitle, shown = run(main())
    assert subtitle == "target" and shown["drafter"] == "drafter"
    saved = settings_module.load()
    assert (saved.model, saved.drafter) == (str(target), str(drafter))


def test_switching_the_model_mid_answer_stops_the_answer_and_loads_the_new_model(home, tiny_pair):
    target, _ = tiny_pair

    async def main():
        app = make_app(tiny_pair, max_new_tokens=400)
        async with app.run_test(size=(120, 36)) as pilot:
            await loaded(pilot, app)
            first_pair = app.chat.backend.pair
            paced = Paced(first_pair)
            await send(pilot, "tell me a long story")
            await paced.until(
                pilot, lambda: app.chat.turn is not None and app.chat.turn.message.content, "the first streamed text"
            )
            # the same target without its drafter: a different model, loaded while the answer streams
            app.chat.apply_settings(replace(app.chat.settings, model=str(target), drafter="", max_new_tokens=3))
            await wait_for(pilot, lambda: app.chat.turn is None, 60, "the answer to stop")
            stopped = app.chat.last_end
            await wait_for(pilot, lambda: app.chat.backend.pair not in (None, first_pair), 60, "the new model to load")
            held = (app.chat.backend.transcript, dict(app.chat.backend.transcripts))
            await ask(pilot, app, "next", 2)
            return stopped, held, app.chat.backend.pair.drafter_name, app.chat.last_end

    stopped, (transcript, transcripts), drafter, end = run(main())
    assert stopped.reason == "cancelled" and 0 < stopped.stats.new_tokens < 400
    # the old model's tokens are not offered to the new one as a prefix
    assert transcript is None and transcripts == {}
    assert drafter is None
    assert end.reason in ("length", "stop") and end.stats.reused_tokens == 0
    assert "dflash" not in end.stats.methods  # no drafter now (prompt lookup may still draft)


def test_a_model_load_started_before_the_settings_changed_is_dropped(home, tiny_pair, tmp_path):
    hook = Seen(ModelLoaded)

    async def main():
        app = make_app(tiny_pair)
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            # the tiny pair is loading; name a model that fails at once, before it is done
            app.chat.apply_settings(replace(app.chat.settings, model=str(tmp_path / "gone"), drafter=""))
            await wait_for(pilot, lambda: hook.messages, 60, "the first load to finish")
            await pilot.pause()
            return app.chat.backend.pair, app.chat.sub_title, app.chat.notice(), app.chat.backend.source.target

    pair, subtitle, note, target = run(main())
    assert pair is None and subtitle == "no model"
    assert note.startswith("The model did not load") and "gone" in note
    assert target == str(tmp_path / "gone")
