"""Images as chips: those waiting for the next message above the message box (a colour preview, the name and size,
a ✕ to remove; Delete or Backspace removes the focused one), and those a sent message holds, in the chat.

The preview is drawn in half-block cells (two pixels a cell, colours from the image), which every truecolor
terminal shows and the snapshots can hold: sixel and kitty graphics need a terminal query before Textual starts
(textual-image 0.12's import does three: 0.8 s more on a terminal that does not answer, and a key typed meanwhile
can be swallowed).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.color import Color
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Static

from dflash_chat.chat.images import Attachment, Preview


def preview_text(preview: Preview) -> Text:
    """The preview as text: '▀' cells, the upper pixel as the foreground, the lower as the background."""
    text = Text(no_wrap=True, overflow="crop")
    for top, bottom in zip(preview[::2], preview[1::2], strict=False):
        if text:
            text.append("\n")
        for up, down in zip(top, bottom, strict=True):
            text.append("▀", Style(color=Color.from_rgb(*up), bgcolor=Color.from_rgb(*down)))
    return text


class ImageChip(Horizontal):
    """An image waiting for the next message: preview, name and size, ✕. Delete, Backspace or a click on ✕
    removes it."""

    can_focus = True
    BINDINGS = [Binding("delete,backspace", "remove", "Remove image", id="image-remove")]

    @dataclass
    class Removed(Message):
        chip: ImageChip

    def __init__(self, image: Attachment, preview: Preview | None = None) -> None:
        super().__init__(classes="image-chip")
        self.image = image
        self.preview = preview
        self.tooltip = f"{image.reference()} · Delete removes it"

    def compose(self):
        if self.preview:
            yield Static(preview_text(self.preview), classes="image-preview")
        yield Static(Text(self.image.chip(), no_wrap=True, overflow="ellipsis"), classes="image-label")
        yield Static("✕", classes="image-remove")

    def action_remove(self) -> None:
        self.post_message(self.Removed(self))

    def on_click(self, event: events.Click) -> None:
        if event.widget is not None and event.widget.has_class("image-remove"):
            event.stop()
            self.action_remove()


class PendingImages(Horizontal):
    """The chips of the images the next message will hold; hidden while there are none."""

    async def show(self, images: list[tuple[Attachment, Preview | None]]) -> None:
        await self.remove_children()
        if images:
            await self.mount_all([ImageChip(image, preview) for image, preview in images])
        self.display = bool(images)


class MessageImages(Static):
    """A sent message's images, a chip each (name and size), in the chat."""

    def __init__(self, images: tuple[Attachment, ...]) -> None:
        super().__init__("   ".join(f"▨ {image.chip()}" for image in images), classes="message-images", markup=False)
