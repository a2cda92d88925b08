"""The chat in a real pty, through Textual's own driver: in kitty (TERM=xterm-kitty) an attached image reaches the
terminal as kitty's transmission and placeholder cells in the colour that names it, is freed as the app closes, and
nothing is asked of the terminal for it (this pty answers nothing, as a terminal that does not know a query)."""

from __future__ import annotations

import os
import re
import select
import sys
import time
from pathlib import Path

import pytest

pty = pytest.importorskip("pty")
ROOT = Path(__file__).resolve().parents[2]  # this checkout's dflash_chat, whichever one pytest imported

APP = "from dflash_chat.settings import Settings; from dflash_chat.ui.app import DFlashChatApp; DFlashChatApp(Settings()).run()"


def read_until(fd: int, data: bytearray, wanted: bytes, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while wanted not in data and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.05)[0]:
            try:
                data.extend(os.read(fd, 65536))
            except OSError:  # the app exited
                break
    return wanted in data


def test_kitty_gets_the_image_through_textuals_driver_and_no_query(home, tmp_path):
    import fcntl
    import struct
    import termios

    from PIL import Image

    from dflash_chat.ui import terminal_graphics as graphics

    shot = tmp_path / "shot.png"
    Image.new("RGB", (64, 32), (200, 30, 120)).save(shot)
    env = {**os.environ, "TERM": "xterm-kitty", "COLORTERM": "truecolor", "PYTHONPATH": str(ROOT)}
    pid, fd = pty.fork()
    if pid == 0:  # the app, its terminal the pty
        os.execve(sys.executable, [sys.executable, "-c", APP], env)
    data = bytearray()
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 1200, 720))
        assert read_until(fd, data, b"\x1b[?1049h", 60), "the app never drew its screen"
        time.sleep(1)  # the first frames: keys typed before Textual reads them are not the app's to keep
        os.write(fd, f"/image {shot}\r".encode())
        assert read_until(fd, data, graphics.PLACEHOLDER.encode(), 30), "no placeholder cells"
        read_until(fd, data, b"\x1b[0m", 1)
    finally:
        os.write(fd, b"\x11")  # ctrl+q
        read_until(fd, data, b"\x1b[?1049l", 10)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)
    out = data.decode("utf-8", "replace")
    sent = re.search(r"\x1b_Ga=T,U=1,f=100,i=(\d+),c=8,r=2,q=2,m=0;", out)
    assert sent is not None, "the image was not sent"
    r, g, b = graphics.kitty_colour(int(sent[1]))
    assert f"\x1b[38;2;{r};{g};{b}" in out[: out.index(graphics.PLACEHOLDER)][-80:]  # the cells name the image
    freed = out.find(f"\x1b_Ga=d,d=I,i={sent[1]},q=2\x1b\\")
    assert 0 < freed < out.rindex("\x1b[?1049l")  # freed as the app closed, before it left the screen
    assert "a=q" not in out and "\x1b[16t" not in out and "\x1b[14t" not in out  # nothing asked of the terminal
