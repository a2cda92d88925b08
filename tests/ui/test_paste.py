"""Pasted text with control characters: dropped, and the message box keeps working. The bytes go
through the parser the app's terminal driver reads with, as a terminal sends them."""

from __future__ import annotations

import time

import pytest
from textual import constants, events
from textual.drivers import linux_driver

from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.paste import PasteParser, clean
from dflash_chat.ui.widgets.prompt_input import PromptInput

from .conftest import run

# BEL, a cursor-key sequence, ^A ^B ^C, DEL, a tab and a stray ESC, in a bracketed paste
PASTED = "one\x07two\x1b[1;5Athree\x01\x02\x03\x7ffour\ttab\x1b"
TERMINAL = "\x1b[200~" + PASTED + "\x1b[201~"


def submitted_texts():
    seen = []

    def hook(message):
        if isinstance(message, PromptInput.Submitted) and not any(m is message for m in seen):
            seen.append(message)

    return seen, hook


def test_a_paste_with_control_characters_keeps_the_message_box_working(home):
    seen, hook = submitted_texts()

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
            prompt = app.chat.query_one(PromptInput)
            parser = linux_driver.XTermParser()  # what the driver reads the terminal with
            for event in parser.feed(TERMINAL):
                app.post_message(event)
            await pilot.pause()
            pasted = prompt.text
            await pilot.press("x", "enter")
            await pilot.pause()
            return pasted, prompt.has_focus, app.chat.thinking, [m.text for m in seen], app.chat.conversation

    pasted, focused, thinking, sent, conversation = run(main())
    assert pasted == "onetwothreefour\ttab"
    assert focused and thinking is False  # no pasted tab moved the focus, no key toggled anything
    assert sent == ["onetwothreefour\ttabx"]  # Enter sends (without a model the text stays in the box)


def test_a_paste_from_anywhere_is_cleaned_in_the_message_box(home):
    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            prompt = app.chat.query_one(PromptInput)
            app.post_message(events.Paste("a\x1b]0;title\x07b\r\nc\x1b[31mred\x1b[0m\x00"))  # as a driver does
            await pilot.pause()
            return prompt.text

    assert run(main()) == "ab\ncred"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 4096])
def test_the_parser_gives_a_paste_whole_however_the_reads_split_it(size):
    data = "a" + TERMINAL + "b"
    parser = PasteParser()
    tokens = []
    for i in range(0, len(data), size):
        tokens += parser.feed(data[i : i + size])
    assert [(type(t).__name__, getattr(t, "key", None) or t.text) for t in tokens] == [
        ("Key", "a"),
        ("Paste", clean(PASTED)),
        ("Key", "b"),
    ]


def test_the_escape_key_still_arrives_on_its_own():
    parser = PasteParser()
    assert list(parser.feed("\x1b")) == []
    time.sleep(constants.ESCAPE_DELAY + 0.05)
    assert [t.key for t in parser.tick()] == ["escape"]


def test_a_paste_cut_short_by_the_end_of_input_is_kept():
    parser = PasteParser()
    assert list(parser.feed("\x1b[200~half a pas")) == []
    assert [t.text for t in parser.feed("") if isinstance(t, events.Paste)] == ["half a pas"]


@pytest.mark.parametrize(
    "text, cleaned",
    [
        ("plain text\twith a tab\n", "plain text\twith a tab\n"),
        ("crlf\r\nand cr\r", "crlf\nand cr\n"),
        ("\x1b[1;31mred\x1b[0m", "red"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("bell\x07 del\x7f nul\x00 c1\x9b", "bell del nul c1"),
        ("ünïcode ✓ 字", "ünïcode ✓ 字"),
    ],
)
def test_clean(text, cleaned):
    assert clean(text) == cleaned
