"""How image previews are drawn (ui/terminal_graphics.py): chosen from the environment alone for each terminal and
overridden by the previews setting; the cell size read from the kernel (never asked of the terminal), a pty that
reports no pixels or no columns giving None; kitty's sequences; sixel decoded back to the image's pixels."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios

import pytest

from dflash_chat.ui import terminal_graphics as graphics

PLAIN = {"TERM": "xterm-256color", "COLORTERM": "truecolor"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"TERM": "xterm-kitty"}, "kitty"),
        ({"TERM": "xterm-256color", "KITTY_WINDOW_ID": "3"}, "kitty"),  # kitty with TERM set by the user
        ({"TERM": "xterm-ghostty", "TERM_PROGRAM": "ghostty"}, "kitty"),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "ghostty"}, "kitty"),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "WezTerm"}, "sixel"),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "iTerm.app"}, "sixel"),
        ({"TERM": "xterm-256color", "LC_TERMINAL": "iTerm2"}, "sixel"),  # what ssh passes on from iTerm2
        ({"TERM": "foot"}, "sixel"),
        ({"TERM": "foot-extra"}, "sixel"),
        ({"TERM": "xterm", "MLTERM": "3.9.3"}, "sixel"),
        ({"TERM": "contour"}, "sixel"),
        ({"TERM": "xterm-256color", "TERMINAL_NAME": "contour"}, "sixel"),
        ({"TERM": "xterm-256color", "KONSOLE_VERSION": "230805"}, "sixel"),
        ({"TERM": "xterm-256color", "KONSOLE_VERSION": "211200"}, None),  # before Konsole drew sixel
        ({"TERM": "tmux-256color", "TERM_PROGRAM": "tmux"}, None),
        ({"TERM": "xterm-kitty", "TMUX": "/tmp/tmux-0/default,1,0"}, None),  # kitty outside, tmux between
        ({"TERM": "screen-256color", "STY": "1.pts-0"}, None),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "Apple_Terminal"}, None),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "vscode"}, None),
        ({"TERM": "alacritty"}, None),
        ({"TERM": "linux"}, None),
        ({}, None),
        (PLAIN, None),
    ],
)
def test_the_environment_names_the_protocol(environ, expected):
    assert graphics.detected(environ) == expected
    assert graphics.protocol("auto", environ) == expected


def test_the_setting_overrides_the_environment():
    kitty = {"TERM": "xterm-kitty"}
    assert graphics.protocol("blocks", kitty) is None
    assert graphics.protocol("sixel", kitty) == "sixel"
    assert graphics.protocol("kitty", PLAIN) == "kitty"
    assert graphics.protocol("auto", kitty) == "kitty"


def pty_with_size(monkeypatch, rows, columns, width, height):
    """stdout as a pty whose window size is as given (a terminal that reports pixels, or one that does not)."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, width, height))
    stream = os.fdopen(follower, "w")
    monkeypatch.setattr(sys, "__stdout__", stream)
    return leader, stream


@pytest.mark.parametrize(
    "size, cell",
    [
        ((40, 120, 1200, 800), (10, 20)),
        ((40, 120, 0, 0), None),  # no pixels reported: half-blocks
        ((0, 0, 1200, 800), None),  # a pty reporting 0 columns: no division by zero
    ],
)
def test_the_cell_size_comes_from_the_kernel(monkeypatch, size, cell):
    leader, stream = pty_with_size(monkeypatch, *size)
    try:
        assert graphics.cell_pixels() == cell
    finally:
        stream.close()
        os.close(leader)


def test_no_terminal_is_no_cell_size(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "__stdout__", open(tmp_path / "out.txt", "w"))  # noqa: SIM115 - closed with the test
    assert graphics.cell_pixels() is None
    monkeypatch.setattr(sys, "__stdout__", None)
    assert graphics.cell_pixels() is None


def test_kitty_sends_the_image_in_chunks_and_places_it_over_its_cells():
    png = bytes(range(256)) * 35  # 8960 bytes: 11948 of base64, three chunks
    sent = graphics.kitty_transmit(0x12AB34, png, 8, 2)
    chunks = sent.split("\x1b\\")[:-1]
    assert [c[: c.index(";")] for c in chunks] == [
        "\x1b_Ga=T,U=1,f=100,i=1223476,c=8,r=2,q=2,m=1",
        "\x1b_Gm=1,q=2",
        "\x1b_Gm=0,q=2",
    ]
    import base64

    assert base64.b64decode("".join(c[c.index(";") + 1 :] for c in chunks)) == png
    assert all(len(c[c.index(";") + 1 :]) <= graphics.CHUNK for c in chunks)
    assert graphics.kitty_delete(7) == "\x1b_Ga=d,d=I,i=7,q=2\x1b\\"
    assert graphics.kitty_colour(0x12AB34) == (0x12, 0xAB, 0x34)
    cells = graphics.kitty_cells(3, 2)
    assert cells[1] == "".join(graphics.PLACEHOLDER + "\u030d" + d for d in "\u0305\u030d\u030e")  # row 1, cols 0-2
    with pytest.raises(ValueError, match="larger than its placeholders"):
        graphics.kitty_cells(40, 2)


def decode_sixel(text: str) -> list[list[tuple[int, int, int]]]:
    """A sixel sequence back into rows of RGB (0-100 scaled back to 0-255, as its palette holds them)."""
    import re

    assert text.startswith("\x1bPq") and text.endswith("\x1b\\")
    body = text[3:-2]
    size = re.match(r'"1;1;(\d+);(\d+)', body)
    width, height = int(size[1]), int(size[2])
    body = body[size.end() :]
    palette = {int(i): (int(r), int(g), int(b)) for i, r, g, b in re.findall(r"#(\d+);2;(\d+);(\d+);(\d+)", body)}
    body = re.sub(r"#\d+;2;\d+;\d+;\d+", "", body)
    rows = [[None] * width for _ in range(height)]
    top, x, colour = 0, 0, None
    for token in re.findall(r"#\d+|!\d+[?-~]|[?-~]|\$|-", body):
        if token == "-":
            top, x = top + 6, 0
        elif token == "$":
            x = 0
        elif token.startswith("#"):
            colour = palette[int(token[1:])]
        else:
            count, char = (int(token[1:-1]), token[-1]) if token.startswith("!") else (1, token)
            for _ in range(count):
                for bit in range(6):
                    if (ord(char) - 63) >> bit & 1:
                        rows[top + bit][x] = colour
                x += 1
    return rows


def test_sixel_draws_the_image_pixel_for_pixel():
    from PIL import Image

    image = Image.new("RGB", (13, 8), (255, 0, 0))
    image.paste((0, 0, 255), (5, 0, 13, 4))  # blue top right
    image.paste((0, 255, 0), (0, 6, 2, 8))  # green bottom left, in the second band
    rows = decode_sixel(graphics.sixel(image))
    red, blue, green = (100, 0, 0), (0, 0, 100), (0, 100, 0)
    assert rows[0] == [red] * 5 + [blue] * 8 and rows[3] == rows[0]
    assert rows[4] == [red] * 13 and rows[7] == [green] * 2 + [red] * 11
    assert not graphics.sixel(image).endswith("-\x1b\\")  # no line feed after the last band
    at = graphics.sixel_at(4, 9, graphics.sixel(image))
    assert at.startswith("\x1b7\x1b[10;5H\x1bPq") and at.endswith("\x1b\\\x1b8")  # the cursor put back
