"""Loading a model shows a progress bar under the chat: bytes placed of all, rate, time left."""

from __future__ import annotations

from textual.app import App

from dflash_chat.runtime.events import LoadProgress, ModelLoaded
from dflash_chat.runtime.model_source import ModelSource
from dflash_chat.ui.app import STYLESHEET, DFlashChatApp
from dflash_chat.ui.widgets.load_bar import LoadBar

from .conftest import fast_settings, run, wait_for


class Seen:
    def __init__(self) -> None:
        self.events = []

    def __call__(self, message) -> None:
        event = getattr(message, "event", None)
        if isinstance(event, (LoadProgress, ModelLoaded)) and not any(e is event for e in self.events):
            self.events.append(event)


def test_the_bar_shows_bytes_rate_and_time_left():
    class Bare(App):
        CSS_PATH = STYLESHEET  # the app's look

        def compose(self):
            yield LoadBar()

    async def main():
        app = Bare()
        async with app.run_test() as pilot:
            bar = app.query_one(LoadBar)
            hidden = bar.display
            bar.show("Tiny Q8_0", 250_000_000, 1_000_000_000, 0.5)
            await pilot.pause()
            shown = bar.display, bar.figures, str(bar.query_one("#load-what").render())
            progress = bar.query_one("#load-progress").percentage
            bar.hide()
            return hidden, shown, progress, bar.display

    hidden, (shown, figures, what), progress, after = run(main())
    assert hidden is False and shown is True and after is False
    assert figures == "250 MB / 1 GB · 500 MB/s · 2 s left"
    assert what == "Loading Tiny Q8_0" and progress == 0.25


def test_loading_a_model_reports_its_progress_until_every_byte_is_placed(home, tiny_pair):
    hook = Seen()

    async def main():
        app = DFlashChatApp(fast_settings(), ModelSource(*map(str, tiny_pair)))
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            await wait_for(pilot, lambda: app.chat.backend.pair is not None, 60, "the model to load")
            await pilot.pause()
            return app.chat.query_one(LoadBar).display

    shown_after = run(main())
    progress = [e for e in hook.events if isinstance(e, LoadProgress)]
    assert progress and isinstance(hook.events[-1], ModelLoaded)
    assert [e.done for e in progress] == sorted(e.done for e in progress)
    assert progress[-1].done == progress[-1].total > 0
    assert shown_after is False  # the bar goes once the model is ready
