"""A chip's preview of an image: the image itself where the terminal draws graphics (ui/terminal_graphics.py chose
how, from the environment), else half-block cells. Both take the same cells, so a chip's layout is one.

- kitty: the thumbnail is sent when the preview is mounted, freed when it goes; the cells are placeholder text in
  the colour that names it.
- sixel: the cells are blank text; each frame that painted them is followed by the image drawn over them
  (`draw_due`, from the app's post_display_hook), sized by the cells' pixels. It is drawn only while the preview
  is whole on the screen with nothing over it (a sixel is not clipped, and is drawn after the frame): blank cells
  while it is scrolled partly out of view, or a tooltip or notice covers part of it.
- Under a dialog (the chat screen not in front) both are half-blocks, dimmed with the rest: a dimmed placeholder's
  colour names no image, and a sixel would cover the dialog. The chat screen refreshes its previews as it goes
  behind a dialog and comes back (`refresh_previews`).
- Any failure of either (a terminal size not reported, an image that cannot be encoded, no terminal to write to)
  turns that preview to half-blocks for good: never a traceback.
"""

from __future__ import annotations

import logging
import weakref

from rich.color import Color
from rich.style import Style
from rich.text import Text
from textual.app import App
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from dflash_chat.chat.images import Preview
from dflash_chat.ui import terminal_graphics as graphics

log = logging.getLogger(__name__)
_due: weakref.WeakSet[ImagePreview] = weakref.WeakSet()  # sixel previews painted in the frame being written


def block_text(preview: Preview) -> Text:
    """The preview as text: '▀' cells, the upper pixel as the foreground, the lower as the background."""
    text = Text(no_wrap=True, overflow="crop")
    for top, bottom in zip(preview.cells[::2], preview.cells[1::2], strict=False):
        if text:
            text.append("\n")
        for up, down in zip(top, bottom, strict=True):
            text.append("▀", Style(color=Color.from_rgb(*up), bgcolor=Color.from_rgb(*down)))
    return text


def write(app: App, data: str) -> None:
    """Raw output for the terminal, in order with Textual's frames (its driver's writer: the app's own clipboard
    and cursor sequences go the same way)."""
    driver = app._driver
    if driver is None:
        raise RuntimeError("no terminal to write to")
    driver.write(data)


class ImagePreview(Widget):
    """The image in `preview.columns` x `preview.rows` cells, drawn by `protocol` ('kitty', 'sixel', or None for
    half-blocks)."""

    DEFAULT_CSS = "ImagePreview { width: auto; height: auto; }"

    def __init__(self, preview: Preview, protocol: str | None, classes: str = "image-preview") -> None:
        super().__init__(classes=classes)
        self.preview = preview
        self.protocol = protocol
        self.image_id: int | None = None  # kitty: the id the terminal holds the thumbnail under
        self._sixel: tuple[tuple[int, int], str] | None = None  # the cell size it was made for, and its sequence

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return self.preview.columns

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.preview.rows

    def fall_back(self, why: BaseException | str) -> None:
        """Half-blocks from now on."""
        log.info("image preview: %s; half-blocks instead", why)
        self.protocol = None
        self.refresh()

    def on_mount(self) -> None:
        if self.protocol != "kitty":
            return
        try:
            image_id = graphics.new_image_id()
            png = graphics.png_bytes(self.preview.thumbnail)
            write(self.app, graphics.kitty_transmit(image_id, png, self.preview.columns, self.preview.rows))
            self.image_id = image_id
        except Exception as exc:  # noqa: BLE001 - any failure: the half-block preview
            self.fall_back(exc)

    def on_unmount(self) -> None:
        self.release()

    def release(self) -> None:
        """Free kitty's copy of the image (the chip is gone, or the app is closing)."""
        if self.image_id is not None:
            try:
                write(self.app, graphics.kitty_delete(self.image_id))
            except Exception:  # noqa: BLE001 - the app is closing: the terminal frees it with the window
                pass
            self.image_id = None

    def render(self) -> Text:
        if not self._in_front():
            return block_text(self.preview)  # under a dialog: dimmed as text is, and never over the dialog
        try:
            if self.protocol == "kitty" and self.image_id is not None:
                return self._placeholders(self.image_id)
            if self.protocol == "sixel" and self._sixel_text():
                return Text("\n".join(" " * self.preview.columns for _ in range(self.preview.rows)))
        except Exception as exc:  # noqa: BLE001
            self.fall_back(exc)
        return block_text(self.preview)

    def _placeholders(self, image_id: int) -> Text:
        style = Style(color=Color.from_rgb(*graphics.kitty_colour(image_id)))
        lines = graphics.kitty_cells(self.preview.columns, self.preview.rows)
        return Text("\n".join(lines), style=style, no_wrap=True, overflow="crop")

    def render_lines(self, crop: Region) -> list[Strip]:
        lines = super().render_lines(crop)
        if self.protocol == "sixel" and self._sixel is not None and self._drawable(crop):
            _due.add(self)
        return lines

    def _in_front(self) -> bool:
        try:
            return self.screen.is_active
        except Exception:  # noqa: BLE001 - not on a screen (yet)
            return False

    def _drawable(self, crop: Region) -> bool:
        """Whether the whole preview is painted now, on the screen in front, nothing over it (a tooltip, a notice:
        the sixel, drawn after the frame, would cover them)."""
        region = self.region
        if crop != Region(0, 0, region.width, region.height) or not self._in_front():
            return False
        try:
            screen = self.screen
            if screen.find_widget(self).visible_region != region:
                return False
            cells = ((x, y) for y in range(region.y, region.bottom) for x in range(region.x, region.right))
            return all(screen.get_widget_at(x, y)[0] is self for x, y in cells)
        except Exception:  # noqa: BLE001 - not placed on the screen yet: drawn with the next frame
            return False

    def _sixel_text(self) -> str:
        """The thumbnail as sixel at the cells' pixel size, encoded once for each size; a RuntimeError where the
        terminal reports no size."""
        cell = graphics.cell_pixels()
        if cell is None:
            raise RuntimeError("the terminal reports no cell size in pixels")
        if self._sixel is None or self._sixel[0] != cell:
            image = self.preview.thumbnail.copy()
            image.thumbnail((self.preview.columns * cell[0], self.preview.rows * cell[1]))
            self._sixel = (cell, graphics.sixel(image))
        return self._sixel[1]

    def draw_sixel(self) -> None:
        """Draw the image over its cells (after the frame that painted them)."""
        if self._sixel is None or not self.is_mounted:
            return
        try:
            region = self.content_region
            write(self.app, graphics.sixel_at(region.x, region.y, self._sixel[1]))
        except Exception as exc:  # noqa: BLE001
            self._sixel = None
            self.fall_back(exc)


def refresh_previews(screen: Widget) -> None:
    """Paint the screen's previews again (it went behind a dialog, or came back)."""
    for preview in screen.query(ImagePreview):
        preview.refresh()


def draw_due() -> None:
    """Draw the sixel previews the frame just written painted (the app's post_display_hook calls this)."""
    while _due:
        _due.pop().draw_sixel()
