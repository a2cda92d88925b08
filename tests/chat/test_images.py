"""A chat's images: stored once by content hash, written whole, saved in the history by hash and read back as the
engine and a server take them; the paths people type and paste; the Markdown export."""

from __future__ import annotations

import io
import os

import pytest

from dflash_chat.chat import attach
from dflash_chat.chat.conversation import Conversation, Message
from dflash_chat.chat.history import HistoryStore
from dflash_chat.chat.images import Attachment, ImageStore, engine_turns, openai_turns, preview_of
from dflash_chat.chat.markdown import export_markdown, to_markdown
from dflash_chat.errors import UserError


def png(width: int = 40, height: int = 24, colour=(200, 30, 30)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "PNG")
    return out.getvalue()


def test_an_image_is_stored_once_by_its_hash_and_read_back_as_each_backend_takes_it(tmp_path):
    store = ImageStore(tmp_path / "images")
    data = png()
    image, decoded, note = store.add(data, "red.png")
    assert (image.name, image.width, image.height, image.size, image.format, note) == (
        "red.png",
        40,
        24,
        len(data),
        "PNG",
        "",
    )
    assert store.path(image) == tmp_path / "images" / f"{image.digest}.png" and store.path(image).read_bytes() == data
    again, _, _ = store.add(data, "copy of red.png")  # the same bytes: the same file, nothing written twice
    assert again.digest == image.digest and os.listdir(tmp_path / "images") == [image.file_name]

    turns = Conversation(messages=[Message("user", "what colour?", images=(image,))]).chat_turns()
    assert turns == [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "what colour?"}]}
    ]
    fresh = ImageStore(tmp_path / "images")  # another session: decoded from the file
    pixels = engine_turns(turns, fresh)[0]["content"][0]["image"]
    assert pixels.mode == "RGB" and pixels.size == (40, 24) and pixels.getpixel((3, 3)) == (200, 30, 30)
    assert engine_turns(turns, fresh)[0]["content"][0]["image"] is pixels  # kept: the prompt's images stay the same
    url = openai_turns(turns, fresh)[0]["content"][0]
    assert url["type"] == "image_url" and url["image_url"]["url"].startswith("data:image/png;base64,iVBOR")

    store.path(image).unlink()  # the file removed behind the app's back: one line that says what to do
    with pytest.raises(UserError, match="red.png .*is no longer in .*attach it again"):
        engine_turns(turns, ImageStore(tmp_path / "images"))


def test_a_model_that_reads_no_images_gets_a_line_naming_each(tmp_path):
    image = Attachment("cd" * 32, "chart.png", 640, 480, 999, "PNG")
    turns = Conversation(messages=[Message("user", "explain", images=(image,))]).chat_turns(images=False)
    assert turns == [
        {
            "role": "user",
            "content": f"[image chart.png (640×480, sha256 {'cd' * 6}): not shown, this model reads no images]\nexplain",
        }
    ]


def test_the_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    store = ImageStore(tmp_path / "images")
    real_replace = os.replace

    def crash(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    image, _, note = store.add(png(), "red.png")
    assert os.listdir(tmp_path / "images") == []  # no part-written file left behind, under any name
    assert "could not be kept" in note and "No space left" in note
    assert store.data(image) == png()  # still sent in this session
    monkeypatch.setattr(os, "replace", real_replace)


def test_a_preview_keeps_the_aspect_within_its_cells():
    from PIL import Image

    wide = preview_of(Image.new("RGB", (400, 100), (0, 0, 255)))
    tall = preview_of(Image.new("RGB", (16, 48), (0, 255, 0)))
    assert (wide.columns, wide.rows) == (8, 1) and wide.cells[0][0] == (0, 0, 255)
    assert (tall.columns, tall.rows) == (1, 2)
    # a thumbnail for terminals that draw images: the aspect kept, within as many cells of up to 20 x 40 pixels
    assert wide.thumbnail.size == (160, 40) and wide.thumbnail.getpixel((0, 0)) == (0, 0, 255)
    assert tall.thumbnail.size == (16, 48)  # never larger than the image


def test_image_turns_are_saved_by_hash_and_come_back(tmp_path):
    store = ImageStore(tmp_path / "images")
    image, _, _ = store.add(png(), "red.png")
    history = HistoryStore(tmp_path / "history.sqlite3")
    cid = history.create("Colours")
    history.add(cid, Message("user", "what colour?", images=(image,)))
    history.add(cid, Message("assistant", "red"))
    raw = history.db.execute("SELECT images FROM messages WHERE role = 'user'").fetchone()[0]
    assert image.digest in raw and "base64" not in raw and len(raw) < 300  # the hash, never the bytes
    assert HistoryStore(tmp_path / "history.sqlite3").load(cid).messages[0].images == (image,)
    history.db.execute('UPDATE messages SET images = \'[{"digest": "../../etc/passwd"}]\'')
    assert HistoryStore(tmp_path / "history.sqlite3").load(cid).messages[0].images == ()  # hand-edited: left out


def test_the_markdown_export_shows_each_image_beside_it_or_names_it(tmp_path):
    folder = tmp_path / "data" / "images"
    store = ImageStore(folder)
    kept, _, _ = store.add(png(), "red.png")
    gone = Attachment("ef" * 32, "lost [1].png", 10, 10, 99, "PNG")  # its file is no longer stored
    chat = Conversation("Colours", [Message("user", "compare", images=(kept, gone)), Message("assistant", "red")])
    (tmp_path / "out").mkdir()
    export_markdown(chat, tmp_path / "out" / "colours.md", folder)
    text = (tmp_path / "out" / "colours.md").read_text()
    assert (
        f"![red.png](<colours-images/{kept.digest}.png>) *[image: red.png (40×24, sha256 {kept.digest[:12]})]*" in text
    )
    assert f"*[image: lost [1].png (10×10, sha256 {'ef' * 6})]*" in text and "![lost" not in text
    assert (tmp_path / "out" / "colours-images" / kept.file_name).read_bytes() == png()
    assert text.index("red.png") < text.index("compare")  # the images, then the text, as the message shows them
    assert "sha256" in to_markdown(chat)  # without a folder to copy to: named only


@pytest.mark.parametrize(
    "typed, expected",
    [
        ('/image "{dir}/my cat.png"', ["{dir}/my cat.png"]),
        ("/image {dir}/my cat.png", ["{dir}/my cat.png"]),  # one existing file, spaces and all
        ("/image ~/a.png b.jpg", ["~/a.png", "b.jpg"]),
        ("/image a.png\nwhat is it?", ["a.png"]),
    ],
)
def test_image_lines_name_their_paths_and_leave_the_rest(tmp_path, typed, expected):
    (tmp_path / "my cat.png").write_bytes(b"x")
    typed, expected = typed.format(dir=tmp_path), [e.format(dir=tmp_path) for e in expected]
    assert attach.is_command(typed)
    paths, rest = attach.command_paths(typed)
    assert paths == expected and rest == ("what is it?" if "\n" in typed else "")


def test_an_image_line_without_a_path_says_how_to_write_one():
    with pytest.raises(ValueError, match="/image needs a path"):
        attach.command_paths("/image")
    assert not attach.is_command("/images of cats") and not attach.is_command("tell me about /image")


def test_a_paste_of_image_paths_is_taken_as_them_and_anything_else_is_text(tmp_path):
    (tmp_path / "my cat.png").write_bytes(b"x")
    (tmp_path / "dog.JPG").write_bytes(b"x")
    (tmp_path / "notes.txt").write_bytes(b"x")
    cat, dog = str(tmp_path / "my cat.png"), str(tmp_path / "dog.JPG")
    assert attach.pasted_paths(cat) == [cat]  # as typed
    assert attach.pasted_paths(f"'{cat}'") == [cat]  # quoted by the terminal's drop
    assert attach.pasted_paths(cat.replace(" ", "\\ ") + " " + dog) == [cat, dog]  # escaped, two files dropped
    assert attach.pasted_paths(f"file://{cat.replace(' ', '%20')}\n") == [cat]
    assert attach.pasted_paths(str(tmp_path / "notes.txt")) is None  # not an image's name
    assert attach.pasted_paths(f"{cat} is my cat") is None  # words around it: text
    assert attach.pasted_paths(str(tmp_path / "missing.png")) is None


def test_a_server_gets_the_image_as_a_data_url_and_a_lost_one_is_one_sentence(tmp_path):
    import base64
    import json
    import threading

    from dflash_chat.chat.backends.base import AnswerRequest
    from dflash_chat.chat.events import AnswerEnded
    from dflash_chat.engine.sampling_params import SamplingParams

    from .misbehaving import head, sse
    from .test_remote import HELLO, Run, answered, delta, plain

    store = ImageStore(tmp_path / "images")
    image, _, _ = store.add(png(), "red.png")
    turns = Conversation(messages=[Message("user", "what colour?", images=(image,))]).chat_turns()
    sampling = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=8)

    def answer(images: ImageStore):
        with answered(head(), HELLO + sse(delta("", "stop"))) as server:
            run = Run(server.url)
            run.connect()
            run.backend.answer(AnswerRequest(None, turns, False, sampling, threading.Event(), images=images))
            end = run.wait(AnswerEnded).end
            return end, [json.loads(b) for b in server.bodies if b.startswith(b"{")]

    end, bodies = answer(store)
    sent = bodies[0]["messages"][0]["content"]
    assert end.answer == "Hello there" and sent[1] == {"type": "text", "text": "what colour?"}
    assert base64.b64decode(sent[0]["image_url"]["url"].removeprefix("data:image/png;base64,")) == png()

    store.path(image).unlink()  # the file removed behind the app's back, seen by the next session
    end, bodies = answer(ImageStore(tmp_path / "images"))
    assert end.reason == "error" and "red.png" in end.error and "attach it again" in end.error and bodies == []
    plain(end.error)
