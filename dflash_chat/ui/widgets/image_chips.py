"""Images as chips: those waiting for the next message above the message box (a preview, the name and size, a ✕ to
remove; Delete or Backspace removes the focused one), and those a sent message holds, in the chat.

The preview (ui/widgets/image_preview.py) is the image itself where the terminal draws graphics, else half-block
cells; `protocol` says which (ui/terminal_graphics.py: from the environment and the previews setting, no terminal
query).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Static

from dflash_chat.chat.images import Attachment, Preview
from dflash_chat.ui.widgets.image_preview import ImagePreview


class ImageChip(Horizontal):
    """An image waiting for the next message: preview, name and size, ✕. Delete, Backspace or a click on ✕
    removes it."""

    can_focus = True
    BINDINGS = [Binding("delete,backspace", "remove", "Remove image", id="image-remove")]

    @dataclass
    class Removed(Message):
        chip: ImageChip

    def __init__(self, image: Attachment, preview: Preview | None = None, protocol: str | None = None) -> None:
        super().__init__(classes="image-chip")
        self.image = image
        self.preview = preview
        self.protocol = protocol
        self.tooltip = f"{image.reference()} · Delete removes it"

    def compose(self):
        if self.preview:
            yield ImagePreview(self.preview, self.protocol)
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

    async def show(self, images: list[tuple[Attachment, Preview | None]], protocol: str | None = None) -> None:
        """Chips for `images`, their previews drawn by `protocol` ('kitty', 'sixel', or None: half-blocks)."""
        await self.remove_children()
        if images:
            await self.mount_all([ImageChip(image, preview, protocol) for image, preview in images])
        self.display = bool(images)


class MessageImages(Static):
    """A sent message's images, a chip each (name and size), in the chat."""

    def __init__(self, images: tuple[Attachment, ...]) -> None:
        super().__init__("   ".join(f"▨ {image.chip()}" for image in images), classes="message-images", markup=False)
