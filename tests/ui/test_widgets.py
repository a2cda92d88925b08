"""Widgets on their own: the streamed answer with its thinking block, the stats panel."""

from __future__ import annotations

from dataclasses import replace

import pytest
from textual.app import App

from dflash_chat.chat.conversation import CANCELLED, Message
from dflash_chat.runtime.live_stats import LiveStats
from dflash_chat.ui.widgets.chat_view import ChatView
from dflash_chat.ui.widgets.stats_panel import StatsPanel, histogram_bars

from .conftest import STATS, answer_ended, run, screen_lines, wait_for


class Host(App):
    def compose(self):
        yield ChatView()
        yield StatsPanel()


def test_thinking_streams_open_then_collapses_when_the_answer_starts():
    async def main():
        app = Host()
        async with app.run_test(size=(100, 40)) as pilot:
            widget = await app.query_one(ChatView).add_assistant()
            hidden_at_start = not widget.thinking_box.display
            await widget.append("Let me think", "")
            await pilot.pause()
            open_while_thinking = widget.thinking_box.display and not widget.thinking_box.collapsed
            await widget.append(" about it.", "The answer is **42**.")
            await pilot.pause()
            collapsed_after = widget.thinking_box.collapsed
            message = Message("assistant", "The answer is **42**.", thinking="Let me think about it.", status=CANCELLED)
            await widget.finish(message)
            await pilot.pause()
            return (
                hidden_at_start,
                open_while_thinking,
                collapsed_after,
                widget.answer.source,
                widget.query_one(".thinking-text").source,
                str(widget.query_one(".status").render()),
            )

    hidden, open_, collapsed, answer, thinking, status = run(main())
    assert hidden and open_ and collapsed
    assert answer == "The answer is **42**." and thinking == "Let me think about it."
    assert "stopped" in status


def test_panel_shows_live_then_final_figures_and_thinking_effect():
    async def main():
        app = Host()
        async with app.run_test(size=(100, 40)) as pilot:
            panel = app.query_one(StatsPanel)
            live = LiveStats(
                prompt_tokens=10,
                new_tokens=9,
                steps=2,
                drafted=22,
                accepted=6,
                ttft_s=0.1,
                decode_s=0.5,
                recent_lengths=[3, 5],
                draft="auto",
                last_drafted=7,
            )
            panel.show_live(live, speculative=True)
            await pilot.pause()
            during = dict(panel.shown)
            panel.show_final(STATS, thinking=False)
            await pilot.pause()
            effect = dict(panel.shown)
            after = dict(panel.shown)
            plain = replace(
                STATS,
                draft="off",
                new_tokens=13,
                drafted=0,
                accepted=0,
                acceptance_histogram=[0] * 16,
                draft_histogram=[12] + [0] * 15,
            )
            panel.show_final(plain)
            await pilot.pause()
            return during, after, effect, dict(panel.shown)

    during, after, effect, plain = run(main())
    assert during["tok/s (live)"] == "16.0" and during["acceptance"] == "27.3 %"
    assert during["tokens/step"] == "4.00"
    assert during["drafts/step"] == "auto · 7"  # the latest step's, while it streams
    assert after["tok/s (last)"] == "120.0" and "tok/s (live)" not in after
    assert after["acceptance"] == "26.7 %" and after["new"] == "61"
    assert after["drafts/step"] == "auto · 15.0"  # the answer's mean
    assert effect["acceptance off"] == "26.7 %" and "acceptance on" not in effect
    # the drafter loaded, the draft setting off: plain steps, no acceptance to speak of
    assert (plain["drafts/step"], plain["acceptance"], plain["tokens/step"]) == ("off", "—", "1.00")


def test_panel_says_which_methods_drafted_by_their_share_of_the_steps():
    from dflash_chat.engine.events import MethodStats, Step

    async def main():
        app = Host()
        async with app.run_test(size=(100, 40)) as pilot:
            panel = app.query_one(StatsPanel)
            live = LiveStats(draft="auto")
            live.on_step(Step([1], 0, 0, 0.0, 0.0), 0.1)  # the prefill's token
            for method, drafted, accepted in (("mtp", 3, 2), ("lookup", 15, 15), ("mtp", 3, 0), ("plain", 0, 0)):
                live.on_step(Step([1] * (accepted + 1), drafted, accepted, 0.0, 0.0, method), 0.2)
            panel.show_live(live.snapshot(), speculative=True)
            await pilot.pause()
            during = dict(panel.shown)
            final = replace(STATS, steps=10)
            final.methods = {"dflash": MethodStats(6, 60, 30), "plain": MethodStats(4)}
            panel.show_final(final)
            await pilot.pause()
            after = dict(panel.shown)
            panel.show_final(replace(STATS))  # a server's answer (or a saved one): nothing said of methods
            await pilot.pause()
            return during, after, dict(panel.shown)

    during, after, server = run(main())
    assert (during["drafted by mtp"], during["drafted by lookup"]) == ("50%", "25%")
    assert list(during).index("drafted by mtp") < list(during).index("drafted by lookup")  # the largest first
    assert after["drafted by dflash"] == "60%" and "drafted by mtp" not in after
    assert not any(name.startswith("drafted by") for name in server)


def test_histogram_bars_scale_to_the_tallest():
    assert histogram_bars([0, 4, 2]) == " █▄"
    assert histogram_bars([1, 100]) == "▁█"
    assert histogram_bars([]) == "" and histogram_bars([0, 0]) == ""


@pytest.mark.parametrize("size", [(80, 30), (120, 36)])
def test_once_an_answer_ends_every_panel_row_fits_on_one_line_uncut(home, size):
    """At 80 columns the panel sits under the chat in three columns (F2), at 120 beside it: each row's name and
    value are on one line, whole (no "acce… 29.3 %", no thinking row wrapped)."""
    import re

    from dflash_chat.settings import Settings
    from dflash_chat.ui.app import DFlashChatApp

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.chat.is_mounted, 30, "chat screen")
            if size[0] < 100:
                await pilot.press("f2")
            answer_ended(app.chat.panel)
            await pilot.pause()
            top = screen_lines(app)
            app.chat.panel.scroll_end(animate=False)  # at 80 columns the panel scrolls to its last rows
            await pilot.pause()
            return dict(app.chat.panel.shown), top + screen_lines(app)

    shown, lines = run(main())
    assert {"drafted by dflash", "acceptance off", "acceptance on", "drafter quant", "VRAM"} <= set(shown)
    assert not any("…" in line for line in lines)

    def whole(name: str, value: str) -> bool:
        """On one line, or the value on the line under its name (a long one in a narrow column)."""
        name, value = re.escape(name), re.escape(value)
        return any(re.search(rf"(^|\s){name}\s+{value}(\s|$)", line) for line in lines) or any(
            re.search(rf"(^|\s){name}\s", line) and re.search(rf"\s{value}(\s|$)", below)
            for line, below in zip(lines, lines[1:], strict=False)
        )

    for name, value in shown.items():
        assert whole(name, value), (name, value)
