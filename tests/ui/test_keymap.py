"""The [keymap]: remapped keys work wherever the default works, show in the footer and palette,
and keys given twice are reported without leaving any action keyless."""

from __future__ import annotations

from textual.widgets._footer import FooterKey

from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.widgets.prompt_input import PromptInput

from .conftest import run


def footer(app) -> dict[str, str]:
    return {key.description: key.key for key in app.chat.query(FooterKey)}


def palette(app) -> dict[str, str]:
    return {c.title: c.help for c in app.get_system_commands(app.chat)}


def test_a_remapped_key_works_in_the_message_box_and_shows_in_the_footer(home):
    """The README's own example: ctrl+k is also the message box's delete-to-end-of-line."""

    async def main():
        app = DFlashChatApp(Settings(keymap={"toggle-thinking": "ctrl+k"}))
        async with app.run_test(size=(120, 36)) as pilot:
            prompt = app.chat.query_one(PromptInput)
            await pilot.press(*"abc", "home")
            assert prompt.has_focus
            await pilot.press("ctrl+k")
            await pilot.pause()
            return app.chat.thinking, prompt.text, footer(app), palette(app)

    thinking, text, shown, commands = run(main())
    assert thinking is True
    assert text == "abc"  # the key went to the command, not to the message box
    assert shown["Toggle thinking"] == "ctrl+k"
    assert commands["Toggle thinking"].endswith("(ctrl+k)")


def test_a_key_given_twice_is_reported_and_every_action_keeps_a_key(home):
    async def main():
        app = DFlashChatApp(Settings(keymap={"toggle-thinking": "ctrl+k", "new-chat": "ctrl+k"}))
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("ctrl+k")
            thinking = app.chat.thinking
            before = app.chat.conversation
            await pilot.press("ctrl+n")
            await pilot.pause()
            new_chat = app.chat.conversation is not before
            notices = [(n.message, n.timeout) for n in app._notifications]
            return thinking, new_chat, notices, footer(app), palette(app)

    thinking, new_chat, notices, shown, commands = run(main())
    assert thinking is True and new_chat is True
    clash = [(m, t) for m, t in notices if "ctrl+k" in m and "new-chat" in m and "toggle-thinking" in m]
    assert clash and clash[0][1] >= 24 * 3600  # stays until dismissed
    assert "new-chat keeps ctrl+n" in clash[0][0]
    assert shown["Toggle thinking"] == "ctrl+k" and shown["New chat"] == "ctrl+n"
    assert commands["Toggle thinking"].endswith("(ctrl+k)") and commands["New chat"].endswith("(ctrl+n)")


def test_a_remap_onto_another_actions_default_key_is_refused(home):
    async def main():
        app = DFlashChatApp(Settings(keymap={"new-chat": "ctrl+t"}))
        async with app.run_test(size=(120, 36)) as pilot:
            before = app.chat.conversation
            await pilot.press("ctrl+t")
            await pilot.pause()
            return app.chat.thinking, app.chat.conversation is before, [n.message for n in app._notifications]

    thinking, same_chat, notices = run(main())
    assert thinking is True and same_chat  # ctrl+t still toggles thinking
    assert any("ctrl+t is also toggle-thinking's key" in m for m in notices)
