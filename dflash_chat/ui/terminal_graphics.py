"""Whether the terminal draws images, read from the environment alone, and the escape sequences that draw them.

Asking the terminal (a device-attributes or a kitty query) means writing a question and waiting for its answer before
Textual reads the keyboard: a terminal that never answers costs that wait at every start, and a key typed meanwhile
can be taken for the answer. textual-image 0.12 asks three times at import, divides by a pty's zero column count,
and writes its kitty images to stdout behind Textual's writer, so it is not used; the protocols are small enough to
write here. The environment names the terminals that draw graphics:

- kitty (TERM=xterm-kitty, KITTY_WINDOW_ID) and Ghostty (TERM=xterm-ghostty, TERM_PROGRAM=ghostty) draw kitty's
  graphics protocol with Unicode placeholders: the image is sent once, and the cells that show it are ordinary text
  (a private-use character whose colour names the image), so Textual lays them out, clips and repaints them as text;
- WezTerm and iTerm2 (TERM_PROGRAM), foot (TERM=foot...), mlterm (MLTERM), contour (TERM=contour..., TERMINAL_NAME)
  and Konsole from 22.04 (KONSOLE_VERSION) draw sixel: the image is drawn over its cells after each frame that painted
  them, sized by the cells' pixels as the kernel reports them (TIOCGWINSZ: no answer is awaited); where the size is
  not reported, half-blocks;
- inside tmux or screen nothing is drawn (they drop images, or draw them where the pane is not).

Every other terminal gets half-block cells (two pixels a cell, in the image's colours), which any truecolor terminal
shows. The `previews` setting overrides the choice: auto, kitty, sixel or blocks.
"""

from __future__ import annotations

import base64
import io
import random
import sys
from collections.abc import Mapping
from typing import Any

SIXEL_PROGRAMS = ("wezterm", "iterm.app")  # TERM_PROGRAM, lowercased
SIXEL_TERMS = ("foot", "mlterm", "contour")  # TERM's start
KONSOLE_SIXEL = 220400  # KONSOLE_VERSION from which Konsole draws sixel (22.04)


def protocol(setting: str, environ: Mapping[str, str]) -> str | None:
    """How previews are drawn: 'kitty', 'sixel', or None for half-blocks; `setting` is the previews setting."""
    if setting in ("kitty", "sixel"):
        return setting
    if setting == "blocks":
        return None
    return detected(environ)


def detected(environ: Mapping[str, str]) -> str | None:
    """The graphics protocol the environment names ('kitty' or 'sixel'), or None."""
    term = environ.get("TERM", "").lower()
    program = environ.get("TERM_PROGRAM", "").lower()
    if environ.get("TMUX") or environ.get("STY") or term.startswith(("screen", "tmux")):
        return None
    if term in ("xterm-kitty", "xterm-ghostty") or environ.get("KITTY_WINDOW_ID") or program == "ghostty":
        return "kitty"
    if program in SIXEL_PROGRAMS or environ.get("LC_TERMINAL", "").lower() == "iterm2":
        return "sixel"
    if term.startswith(SIXEL_TERMS) or environ.get("MLTERM") or environ.get("TERMINAL_NAME", "").lower() == "contour":
        return "sixel"
    konsole = environ.get("KONSOLE_VERSION", "")
    if konsole.isdigit() and int(konsole) >= KONSOLE_SIXEL:
        return "sixel"
    return None


def cell_pixels() -> tuple[int, int] | None:
    """A terminal cell's (width, height) in pixels as the kernel has it for stdout's terminal, or None where it is
    not reported (0), or there is no terminal. An ioctl: nothing is asked of the terminal."""
    try:
        import fcntl
        import struct
        import termios

        stream = sys.__stdout__
        if stream is None:
            return None
        packed = fcntl.ioctl(stream.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
        rows, columns, width, height = struct.unpack("HHHH", packed)
    except Exception:  # noqa: BLE001 - no terminal, or no such ioctl (Windows): half-blocks
        return None
    if not (rows and columns and width and height):
        return None
    return width // columns, height // rows


# kitty's graphics protocol (https://sw.kovidgoyal.net/kitty/graphics-protocol/), with Unicode placeholders

PLACEHOLDER = "\U0010eeee"
# the first of the protocol's row and column diacritics: a preview's cells are never more than these
DIACRITICS = "\u0305\u030d\u030e\u0310\u0312\u033d\u033e\u033f\u0346\u034a\u034b\u034c\u0350\u0351\u0352\u0357"
CHUNK = 4096  # the protocol's most base64 bytes in one escape sequence
_ids = iter(range(random.randint(1, 2**23), 2**24))  # from a random start: another program's images keep theirs


def new_image_id() -> int:
    """An image id for this process: 24 bits, so that a cell's foreground colour names it."""
    return next(_ids)


def png_bytes(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def kitty_transmit(image_id: int, png: bytes, columns: int, rows: int) -> str:
    """Send a PNG under `image_id` and place it virtually over `columns` x `rows` cells (U=1): the cells printed
    as `kitty_cells` show it, the terminal fitting it into them. Quiet (q=2): the terminal answers nothing."""
    data = base64.standard_b64encode(png).decode("ascii")
    chunks = [data[at : at + CHUNK] for at in range(0, len(data), CHUNK)] or [""]
    first = f"a=T,U=1,f=100,i={image_id},c={columns},r={rows},q=2"
    return "".join(
        f"\x1b_G{first + ',' if n == 0 else ''}m={int(n < len(chunks) - 1)}{',q=2' if n else ''};{chunk}\x1b\\"
        for n, chunk in enumerate(chunks)
    )


def kitty_delete(image_id: int) -> str:
    """Free the image and its placements."""
    return f"\x1b_Ga=d,d=I,i={image_id},q=2\x1b\\"


def kitty_cells(columns: int, rows: int) -> list[str]:
    """The placeholder text of an image `columns` x `rows` cells large, a line a row; printed in the colour
    `kitty_colour(id)`. Each cell names its row and column."""
    if columns > len(DIACRITICS) or rows > len(DIACRITICS):
        raise ValueError(f"a preview of {columns} x {rows} cells is larger than its placeholders")
    return [
        "".join(PLACEHOLDER + DIACRITICS[row] + DIACRITICS[column] for column in range(columns)) for row in range(rows)
    ]


def kitty_colour(image_id: int) -> tuple[int, int, int]:
    return (image_id >> 16) & 255, (image_id >> 8) & 255, image_id & 255


# sixel (DEC's bitmap escape sequence: six pixel rows a band, a palette of up to 256 colours)

SIXEL_COLOURS = 64


def sixel(image: Any, colours: int = SIXEL_COLOURS) -> str:
    """A Pillow image as one sixel sequence, its colours reduced to at most `colours`."""
    rgb = image.convert("RGB")
    width, height = rgb.size
    indexed = rgb.quantize(colors=colours)
    palette = indexed.getpalette() or []
    pixels = indexed.tobytes()
    used = sorted(set(pixels))
    out = ["\x1bPq", f'"1;1;{width};{height}']  # square pixels, the image's size
    for index in used:
        r, g, b = palette[index * 3 : index * 3 + 3]
        out.append(f"#{index};2;{r * 100 // 255};{g * 100 // 255};{b * 100 // 255}")
    for top in range(0, height, 6):
        band = [pixels[y * width : (y + 1) * width] for y in range(top, min(top + 6, height))]
        masks: dict[int, list[int]] = {}  # colour -> each column's six bits
        for n, row in enumerate(band):
            for x, index in enumerate(row):
                mask = masks.get(index)
                if mask is None:
                    mask = masks[index] = [0] * width
                mask[x] |= 1 << n
        out.append("$".join(f"#{index}{_runs(masks[index])}" for index in sorted(masks)) + "-")
    out[-1] = out[-1].removesuffix("-")  # no line feed after the last band: the screen never scrolls for it
    out.append("\x1b\\")
    return "".join(out)


def _runs(bits: list[int]) -> str:
    """A band's sixel characters for one colour, runs of 4 or more written as !N."""
    out, at = [], 0
    while at < len(bits):
        end = at
        while end < len(bits) and bits[end] == bits[at]:
            end += 1
        char = chr(63 + bits[at])
        out.append(f"!{end - at}{char}" if end - at > 3 else char * (end - at))
        at = end
    return "".join(out)


def sixel_at(column: int, row: int, sixel_text: str) -> str:
    """A sixel image drawn with its top left at a screen cell (0-based), the cursor put back where it was."""
    return f"\x1b7\x1b[{row + 1};{column + 1}H{sixel_text}\x1b8"
