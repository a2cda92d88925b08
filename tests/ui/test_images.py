"""Images in the chat, through Textual's pilot: attached by a /image line, the attach key or a pasted path, shown
as chips above the message box and removed from there, refused with a notice (nothing typed lost), refused by a
model without a vision tower, sent to the real engine (a tiny random vision-language model built here), saved by
content hash and shown again when the chat is opened in a new session; the chip's preview the image itself in a
kitty or sixel terminal (known from the environment), half-blocks elsewhere, by the previews setting, or when the
graphics path fails."""

from __future__ import annotations

import pytest
from textual import events
from textual.widgets import Input

from dflash_chat import paths
from dflash_chat.chat.events import PromptSent
from dflash_chat.chat.history import HistoryStore
from dflash_chat.runtime.image_decode import MAX_BYTES
from dflash_chat.runtime.model_source import ModelSource
from dflash_chat.settings import Settings
from dflash_chat.ui.app import DFlashChatApp
from dflash_chat.ui.dialogs import TextDialog
from dflash_chat.ui.widgets.chat_view import UserMessage
from dflash_chat.ui.widgets.image_chips import ImageChip
from dflash_chat.ui.widgets.prompt_input import PromptInput
from dflash_chat.ui.widgets.stats_panel import format_rate

from .conftest import answered, fast_settings, loaded, run, send, wait_for
from .test_chat_engine import Seen


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    """A tiny random Qwen3.5 vision-language checkpoint whose folder holds its vision tower."""
    from tests.engine.tiny_vlm import write_vlm, write_vlm_tokenizer

    folder = tmp_path_factory.mktemp("tiny-vlm") / "vlm"
    write_vlm(folder)
    write_vlm_tokenizer(folder)
    return folder


def picture(path, size=(40, 24), colour=(220, 40, 40)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def notices(app) -> list[str]:
    return [n.message for n in app._notifications]


def pending(app) -> list[str]:
    return [image.name for image, _ in app.chat.pending]


async def typed(pilot, app, text: str) -> None:
    """Type `text` in the message box and press Enter; then wait until the images it named are read."""
    box = app.chat.query_one(PromptInput)
    box.focus()
    box.insert(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.chat.attaching == 0, 30, "the images to be read")
    await pilot.pause()


def test_images_attach_by_command_key_and_paste_and_chips_remove_them(home, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    picture(tmp_path / "user" / "Pictures" / "red square.png")
    picture(tmp_path / "shots" / "tall.png", (16, 48), (30, 200, 30))
    picture(tmp_path / "dropped one.jpg", (64, 64), (30, 30, 220))
    picture(tmp_path / "by key.png", (20, 20))

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            box = app.chat.query_one(PromptInput)
            await typed(pilot, app, '/image "~/Pictures/red square.png" shots/tall.png\nwhat are these?')
            by_command = pending(app), box.text
            chips = [chip.image.chip() for chip in app.chat.query(ImageChip)]

            app.post_message(events.Paste(f"'{tmp_path / 'dropped one.jpg'}'"))  # as a terminal's drop pastes it
            await wait_for(pilot, lambda: len(app.chat.pending) == 3, 30, "the pasted image")
            app.post_message(events.Paste(" and a typed line"))  # text stays text
            await pilot.pause()
            after_paste = box.text

            await pilot.press("f4")
            await wait_for(pilot, lambda: isinstance(app.screen, TextDialog), 10, "the path dialog")
            app.screen.query_one(Input).value = "by key.png"
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(app.chat.pending) == 4, 30, "the image named in the dialog")

            app.chat.query(ImageChip).first().focus()
            await pilot.press("delete")
            await pilot.pause()
            await pilot.click(".image-chip .image-remove")  # the ✕ of the first chip left
            await pilot.pause()
            return by_command, chips, after_paste, pending(app), box.has_focus, app.chat.conversation.messages

    by_command, chips, after_paste, left, focused, sent = run(main())
    assert by_command == (["red square.png", "tall.png"], "what are these?")  # the line gone, the question kept
    assert chips == ["red square.png · 40×24", "tall.png · 16×48"]
    assert after_paste == "what are these? and a typed line"
    assert left == ["dropped one.jpg", "by key.png"] and focused  # two removed; back to the message box
    assert sent == []  # attaching sends nothing


def test_a_bad_file_is_a_notice_and_what_was_typed_stays(home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    picture(tmp_path / "red.png")
    picture(tmp_path / "copy.png")
    (tmp_path / "notes.png").write_text("not a picture at all")
    with open(tmp_path / "huge.png", "wb") as huge:
        huge.truncate(MAX_BYTES + 1)  # sparse: no time spent writing it

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            box = app.chat.query_one(PromptInput)
            seen = []
            for name in ("missing.png", "notes.png", "huge.png"):
                box.clear()
                await typed(pilot, app, f"/image {name}\nmy question about {name}")
                seen.append((notices(app)[-1], box.text))
            box.clear()
            await typed(pilot, app, "/image")
            seen.append((notices(app)[-1], box.text))
            box.clear()
            await typed(pilot, app, "/image red.png copy.png")  # one image under two names: attached once
            seen.append((notices(app)[-1], box.text))
            return seen, pending(app)

    seen, left = run(main())
    assert "missing.png: no such file; check the path" in seen[0][0]
    assert "notes.png is not an image this app reads" in seen[1][0]
    assert "huge.png is 32.0 MiB; images up to 32 MiB are read" in seen[2][0]
    for (_, text), name in zip(seen, ("missing.png", "notes.png", "huge.png"), strict=False):
        assert text == f"/image {name}\nmy question about {name}"  # the line back, the question kept
    assert seen[3] == ("/image needs a path: /image PATH (quote a path with spaces)", "/image")
    assert seen[4] == ("copy.png is attached already (the same image as red.png).", "") and left == ["red.png"]


def test_a_model_without_a_vision_tower_says_so_and_sends_nothing(home, tmp_path, tiny_pair):
    """The tiny text pair: attaching is refused in one line; images attached before it loaded are not sent."""
    shot = picture(tmp_path / "shot.png")

    async def main():
        app = DFlashChatApp(fast_settings())  # no model yet: images can be attached
        async with app.run_test(size=(120, 36)) as pilot:
            await typed(pilot, app, f"/image {shot}")
            before = pending(app)
            app.chat.backend.request = ModelSource(str(tiny_pair[0]), str(tiny_pair[1]))
            app.chat.begin()
            await loaded(pilot, app)
            await send(pilot, "what is it?")
            refused_send = notices(app)[-1], app.chat.query_one(PromptInput).text, app.chat.conversation.messages[:]
            app.post_message(events.Paste(str(shot)))
            await pilot.pause()
            refused_paste = notices(app)[-1], app.chat.query_one(PromptInput).text
            await pilot.press("f4")
            await pilot.pause()
            no_dialog = not isinstance(app.screen, TextDialog)
            app.chat.query(ImageChip).first().focus()
            await pilot.press("delete")
            await pilot.pause()
            app.chat.query_one(PromptInput).clear()
            await send(pilot, "hello")
            await answered(pilot, app, 1)
            return before, refused_send, refused_paste, no_dialog, app.chat.conversation.messages

    before, (note, text, messages), (paste_note, pasted), no_dialog, chat = run(main())
    assert before == ["shot.png"]
    assert note.startswith("Not sent: This model reads no images: it has no vision tower: choose a vision model, ")
    assert "--mmproj FILE" in note and text == "what is it?" and messages == []
    assert paste_note.startswith("This model reads no images") and pasted == f"what is it?{shot}"  # typed instead
    assert no_dialog
    assert [m.role for m in chat] == ["user", "assistant"] and chat[0].images == ()  # without the image: answered


def test_an_image_turn_reaches_the_engine_is_saved_by_hash_and_comes_back(home, tmp_path, tiny_vlm):
    import hashlib

    from PIL import Image

    from tests.engine.tiny_vlm import IMAGE_TOKEN

    shot = picture(tmp_path / "shot.png", (40, 24))
    prompts = Seen(PromptSent)

    async def first():
        app = DFlashChatApp(fast_settings(draft=4), ModelSource(str(tiny_vlm), None))  # every step drafts
        async with app.run_test(size=(120, 36), message_hook=prompts) as pilot:
            await loaded(pilot, app)
            await typed(pilot, app, f"/image {shot}")
            await send(pilot, "what colour is it?")
            await answered(pilot, app, 1)
            shown = [widget.images for widget in app.chat.query(UserMessage)]
            stats = app.chat.conversation.messages[-1].stats
            return app.chat.conversation.id, shown, stats, dict(app.chat.panel.shown)

    cid, shown, stats, panel = run(first())
    image = shown[0][0]
    assert (image.name, image.width, image.height) == ("shot.png", 40, 24)
    prompt = prompts.messages[-1].prompt
    assert len(prompt.images) == 1 and prompt.ids.count(IMAGE_TOKEN) == prompt.images[0].tokens
    rgb = Image.open(shot).convert("RGB")  # the engine knows an image by its pixels (engine/images.py)
    assert prompt.images[0].digest == hashlib.sha256(b"40x24:" + rgb.tobytes()).digest()
    stored = paths.data_dir() / "images" / f"{image.digest}.png"
    assert stored.read_bytes() == shot.read_bytes()
    assert HistoryStore(paths.history_db()).load(cid).messages[0].images == (image,)
    # the panel shows this answer's own figures, the image's tokens counted in the prompt's
    assert stats is not None and stats.prompt_tokens == len(prompt.ids)
    assert panel["prompt"] == f"{len(prompt.ids)} (0 reused)" and panel["new"] == str(stats.new_tokens)
    assert stats.image_tokens == prompt.images[0].tokens and panel["images"].startswith(f"{stats.image_tokens} · ")
    assert stats.drafted and panel["acceptance"] == format_rate(stats.acceptance_rate)
    assert panel["tokens/step"] == f"{stats.mean_acceptance_length:.2f}"
    # beside the thinking comparison, which it leaves alone
    assert panel["acceptance, images"] == format_rate(stats.acceptance_rate) and "acceptance off" not in panel
    shot.unlink()  # the chat needs only its stored copy from now on

    async def again():
        app = DFlashChatApp(fast_settings(), ModelSource(str(tiny_vlm), None))
        async with app.run_test(size=(120, 36), message_hook=prompts) as pilot:
            await loaded(pilot, app)
            await app.chat.open_conversation(cid)
            reopened = [widget.images for widget in app.chat.query(UserMessage)]
            await send(pilot, "and now?")
            await answered(pilot, app, 2)
            return reopened

    assert run(again()) == [(image,)]
    follow_up = prompts.messages[-1].prompt
    assert [i.digest for i in follow_up.images] == [prompt.images[0].digest]  # read back from the data folder


def test_the_history_screen_exports_a_chat_with_its_images_and_deleting_one_removes_what_no_chat_holds(home, tmp_path):
    from textual.widgets import DataTable

    from dflash_chat.chat.conversation import Message
    from dflash_chat.chat.images import ImageStore
    from dflash_chat.ui.history_screen import HistoryScreen

    store = HistoryStore(paths.history_db(), clock=iter(range(1, 100)).__next__)
    images = ImageStore(store.images_folder)  # as an earlier session stored them
    shared, _, _ = images.add(picture(tmp_path / "shared.png").read_bytes(), "shared.png")
    own, _, _ = images.add(picture(tmp_path / "own.png", colour=(1, 2, 3)).read_bytes(), "own.png")
    kept = store.create("Kept")
    store.add(kept, Message("user", "this one", images=(shared,)))
    doomed = store.create("Doomed")
    store.add(doomed, Message("user", "these", images=(shared, own)))
    store.close()
    export_dir = tmp_path / "exports"

    async def main():
        app = DFlashChatApp(Settings(), export_dir=export_dir)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 30, "history screen")
            await pilot.press("e")  # the newest first: Doomed
            await wait_for(pilot, lambda: app.screen.query("#dialog-input"), 30, "export dialog")
            await pilot.press("enter")
            await pilot.pause()
            await pilot.press("d")
            await wait_for(pilot, lambda: app.screen.query("#yes"), 30, "confirm dialog")
            await pilot.press("y")
            await wait_for(pilot, lambda: app.screen.query_one(DataTable).row_count == 1, 30, "the chat deleted")

    run(main())
    text = (export_dir / "doomed.md").read_text()
    for image in (shared, own):
        assert f"![{image.name}](<doomed-images/{image.file_name}>) *[image: {image.reference()}]*" in text
        assert (export_dir / "doomed-images" / image.file_name).read_bytes() == (tmp_path / image.name).read_bytes()
    folder = paths.data_dir() / "images"
    assert sorted(p.name for p in folder.iterdir()) == [shared.file_name]  # own.png went with its only chat


def test_a_message_with_images_sent_while_a_text_model_loads_waits_and_the_chat_goes_on(home, tmp_path, tiny_pair):
    """Sent while the model loads, a message's images wait for it; a model without a vision tower leaves that
    message unanswered (said in one line), and the next message is answered with each image named in words."""
    shot = picture(tmp_path / "shot.png")
    prompts = Seen(PromptSent)

    async def main():
        app = DFlashChatApp(fast_settings())
        async with app.run_test(size=(120, 36), message_hook=prompts) as pilot:
            await typed(pilot, app, f"/image {shot}")
            app.chat.backend.request = ModelSource(str(tiny_pair[0]), str(tiny_pair[1]))
            box = app.chat.query_one(PromptInput)
            app.chat.begin()
            box.post_message(PromptInput.Submitted(box, "what is it?"))  # Enter while the model is on its way
            await wait_for(pilot, lambda: app.chat.waiting is not None or app.chat.backend.pair, 10, "the message")
            waited = app.chat.waiting is app.chat.conversation and app.chat.backend.pair is None
            await loaded(pilot, app)
            await pilot.pause()
            unanswered = [n for n in notices(app) if n.startswith("Your message was not answered")]
            roles = [m.role for m in app.chat.conversation.messages]
            await send(pilot, "hello")
            await answered(pilot, app, 1)
            return waited, unanswered, roles, app.chat.conversation.messages

    waited, unanswered, roles, chat = run(main())
    assert waited and roles == ["user"] and len(unanswered) == 1
    assert unanswered[0].startswith("Your message was not answered: This model reads no images: it has no vision")
    assert [m.role for m in chat] == ["user", "user", "assistant"] and chat[0].images[0].name == "shot.png"
    text = prompts.messages[-1].prompt.text
    assert f"[image {chat[0].images[0].reference()}: not shown, this model reads no images]\nwhat is it?" in text


def preview_lines(preview) -> list[list]:
    """The preview's cells as the screen gets them: (text, foreground, background) a cell."""
    from textual.geometry import Region

    strips = preview.render_lines(Region(0, 0, preview.region.width, preview.region.height))
    return [
        [(s.text, s.style.color.triplet if s.style.color else None, s.style.bgcolor) for s in strip] for strip in strips
    ]


async def attach_one(pilot, app, path, sent: list[str]) -> object:
    """Attach `path` with the terminal's output captured in `sent`; the chip's preview."""
    from dflash_chat.ui.widgets.image_preview import ImagePreview

    app._driver.write = sent.append  # what would go to the terminal, in order
    await typed(pilot, app, f"/image {path}")
    await pilot.pause()
    return app.chat.query_one(ImagePreview)


def test_a_kitty_terminal_gets_the_image_itself_and_the_chip_frees_it(home, tmp_path, monkeypatch):
    import base64
    import io

    from PIL import Image

    from dflash_chat.ui import terminal_graphics as graphics

    monkeypatch.setenv("TERM", "xterm-kitty")
    shot = picture(tmp_path / "shot.png", (64, 32), (200, 30, 120))

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            sent: list[str] = []
            preview = await attach_one(pilot, app, shot, sent)
            shown = preview.protocol, preview.image_id, preview_lines(preview), list(sent)
            app.chat.query_one(ImageChip).focus()
            await pilot.press("delete")
            await pilot.pause()
            return shown, sent

    (protocol, image_id, cells, transmitted), sent = run(main())
    assert protocol == "kitty" and image_id is not None
    colour = graphics.kitty_colour(image_id)
    # 64 x 32 fits 8 x 2 cells; each cell the placeholder naming its row and column, in the colour naming the image
    assert ["".join(text for text, _, _ in row) for row in cells] == graphics.kitty_cells(8, 2)
    assert {fg for row in cells for _, fg, _ in row} == {colour}
    assert len(transmitted) == 1 and transmitted[0].startswith(f"\x1b_Ga=T,U=1,f=100,i={image_id},c=8,r=2,q=2")
    payload = "".join(part.split(";", 1)[1] for part in transmitted[0].split("\x1b\\") if part)
    assert Image.open(io.BytesIO(base64.b64decode(payload))).size == (64, 32)  # small already: sent as it is
    assert sent[-1] == graphics.kitty_delete(image_id)  # the chip removed: the terminal frees the image


def test_half_blocks_where_the_terminal_draws_no_images_or_the_setting_says_so(home, tmp_path, monkeypatch):
    from dflash_chat.ui.widgets.image_preview import block_text

    shot = picture(tmp_path / "shot.png", (64, 32), (200, 30, 120))

    async def main(settings):
        app = DFlashChatApp(settings)
        async with app.run_test(size=(120, 36)) as pilot:
            sent: list[str] = []
            preview = await attach_one(pilot, app, shot, sent)
            return preview.protocol, preview.image_id, preview.render(), block_text(preview.preview), sent

    for environ, settings in (({}, Settings()), ({"TERM": "xterm-kitty"}, Settings(previews="blocks"))):
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        protocol, image_id, shown, blocks, sent = run(main(settings))
        assert (protocol, image_id) == (None, None) and shown == blocks and sent == []
        assert shown.plain == "▀" * 8 + "\n" + "▀" * 8


def test_a_sixel_terminal_gets_the_image_drawn_over_its_cells_after_each_frame(home, tmp_path, monkeypatch):
    from dflash_chat.ui import terminal_graphics as graphics

    monkeypatch.setenv("TERM", "foot")
    monkeypatch.setattr(graphics, "cell_pixels", lambda: (10, 20))
    shot = picture(tmp_path / "shot.png", (64, 32), (200, 30, 120))

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            sent: list[str] = []
            preview = await attach_one(pilot, app, shot, sent)
            drawn = list(sent)
            sent.clear()
            app.chat.query_one(ImageChip).focus()  # the chip repainted: the image drawn again over it
            await pilot.pause()
            return preview.protocol, preview.content_region, preview_lines(preview), drawn, sent

    protocol, region, cells, drawn, again = run(main())
    assert protocol == "sixel"
    assert ["".join(text for text, _, _ in row) for row in cells] == [" " * 8, " " * 8]  # blank under the image
    at = f"\x1b7\x1b[{region.y + 1};{region.x + 1}H\x1bPq"
    assert drawn and all(d.startswith(at) and d.endswith("\x1b8") for d in drawn)
    assert '"1;1;64;32' in drawn[0]  # the thumbnail fits 8 x 2 cells of 10 x 20 pixels: 80 x 40
    assert again and again[-1] == drawn[-1]


def test_a_graphics_preview_that_fails_is_half_blocks_and_the_chat_goes_on(home, tmp_path, monkeypatch):
    """A kitty image that cannot be encoded, a sixel that cannot be drawn, a terminal that reports no cell size:
    each chip shows half-blocks, no error reaches the user, and the image stays attached."""
    from dflash_chat.ui import terminal_graphics as graphics
    from dflash_chat.ui.widgets.image_preview import block_text

    shot = picture(tmp_path / "shot.png", (64, 32), (200, 30, 120))

    def broken(*_):
        raise OSError("the encoder failed")

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            preview = await attach_one(pilot, app, shot, [])
            await pilot.pause()
            return preview.protocol, preview.render(), block_text(preview.preview), pending(app), notices(app)

    cases = [
        ("xterm-kitty", "png_bytes", broken),
        ("foot", "sixel", broken),
        ("foot", "cell_pixels", lambda: None),
    ]
    for term, name, replacement in cases:
        with monkeypatch.context() as patch:
            patch.setenv("TERM", term)
            patch.setattr(graphics, "cell_pixels", lambda: (10, 20))
            patch.setattr(graphics, name, replacement)
            protocol, shown, blocks, attached, said = run(main())
        assert (protocol, shown, attached, said) == (None, blocks, ["shot.png"], []), (term, name)


def test_the_settings_screen_turns_previews_to_half_blocks_and_back(home, tmp_path, monkeypatch):
    """In kitty, previews set to blocks on the settings screen: the next chips are half-blocks, saved in
    config.toml; set back to auto, kitty's image again."""
    from dflash_chat import settings as settings_module
    from dflash_chat.ui.settings_screen import SettingsScreen
    from dflash_chat.ui.widgets.image_preview import ImagePreview

    monkeypatch.setenv("TERM", "xterm-kitty")
    shot = picture(tmp_path / "shot.png")

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 40)) as pilot:
            seen = []
            for choice in ("blocks", "auto"):
                await pilot.press("ctrl+s")
                await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), 30, "settings screen")
                app.screen.query_one("#field-previews").value = choice
                await pilot.press("ctrl+s")
                await wait_for(pilot, lambda: app.screen is app.chat, 30, "back to chat")
                seen.append((settings_module.load().previews, (await attach_one(pilot, app, shot, [])).protocol))
                app.chat.query_one(ImageChip).focus()
                await pilot.press("delete")
                await wait_for(pilot, lambda: not app.chat.query(ImagePreview), 10, "the chip removed")
            return seen

    assert run(main()) == [("blocks", None), ("auto", "kitty")]


def test_behind_a_dialog_a_preview_is_half_blocks_and_the_image_comes_back_after(home, tmp_path, monkeypatch):
    """Dimmed under a dialog, a placeholder's colour would name no image, and a sixel would cover the dialog."""
    from dflash_chat.ui import terminal_graphics as graphics

    shot = picture(tmp_path / "shot.png")

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            sent: list[str] = []
            await attach_one(pilot, app, shot, sent)
            phases = [(app.export_screenshot().count(graphics.PLACEHOLDER), sum("\x1bPq" in s for s in sent))]
            sent.clear()
            await pilot.press("f4")
            await wait_for(pilot, lambda: isinstance(app.screen, TextDialog), 10, "the path dialog")
            await pilot.pause()
            sent.clear()
            app.screen.refresh()  # the dialog and the chat behind it painted again
            await pilot.pause()
            phases.append((app.export_screenshot().count(graphics.PLACEHOLDER), sum("\x1bPq" in s for s in sent)))
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is app.chat, 10, "the dialog closed")
            await pilot.pause()
            phases.append((app.export_screenshot().count(graphics.PLACEHOLDER), sum("\x1bPq" in s for s in sent)))
            return phases

    monkeypatch.setenv("TERM", "xterm-kitty")
    (before, _), (behind, _), (after, _) = run(main())
    assert before > 0 and behind == 0 and after == before
    monkeypatch.setenv("TERM", "foot")
    monkeypatch.setattr(graphics, "cell_pixels", lambda: (10, 20))
    (_, drawn), (_, drawn_behind), (_, drawn_after) = run(main())
    assert drawn > 0 and drawn_behind == 0 and drawn_after > 0  # drawn again once the chat is in front


def test_a_sixel_is_not_drawn_over_what_covers_its_cells(home, tmp_path, monkeypatch):
    """A tooltip or a notice over the preview: the image (drawn after the frame) would cover it, so it waits."""
    from textual.widgets import Static

    from dflash_chat.ui import terminal_graphics as graphics

    monkeypatch.setenv("TERM", "foot")
    monkeypatch.setattr(graphics, "cell_pixels", lambda: (10, 20))
    shot = picture(tmp_path / "shot.png")

    async def main():
        app = DFlashChatApp(Settings())
        async with app.run_test(size=(120, 36)) as pilot:
            sent: list[str] = []
            preview = await attach_one(pilot, app, shot, sent)
            region = preview.region
            cover = Static("over it")
            cover.styles.overlay = "screen"
            cover.styles.position = "absolute"
            cover.styles.offset = (region.x + 2, region.y)
            await app.chat.mount(cover)
            sent.clear()
            preview.refresh()
            await pilot.pause()
            covered = sum("\x1bPq" in s for s in sent)
            await cover.remove()
            await pilot.pause()
            return covered, sum("\x1bPq" in s for s in sent)

    covered, uncovered = run(main())
    assert covered == 0 and uncovered > 0
