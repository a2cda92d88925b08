"""Pasted text: a bracketed paste stays one paste, and its control characters are dropped.

Textual's terminal parser (8.2) takes an ESC inside a bracketed paste for the start of a key
sequence and re-sends the characters after it as key presses, ahead of the paste itself: pasted
text holding an escape sequence (coloured terminal output, say) reorders the input, a pasted tab
moves the focus and a pasted return sends. `PasteParser` takes each bracketed paste out of the
input stream before Textual's parser reads it and gives that parser only the cleaned text between
the brackets, which it turns into one Paste event. `install()` makes Textual's terminal drivers use
it. `clean` is also what the message box applies to every paste, whatever its source.
"""

from __future__ import annotations

import importlib
import re

from textual._xterm_parser import XTermParser

START, END = "\x1b[200~", "\x1b[201~"
# CSI (colours, cursor keys), OSC (titles, links) and the other string sequences, and 2-byte escapes
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[PX^_][^\x1b]*\x1b\\|[@-Z\\-_])"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but tab and newline, DEL and C1 included
DRIVERS = (
    "textual.drivers.linux_driver",
    "textual.drivers.linux_inline_driver",
    "textual.drivers.web_driver",
    "textual.drivers.win32",
)


def clean(text: str) -> str:
    """Pasted text as it may enter a text box: line ends as \\n, tabs kept, escape sequences and every
    other control character dropped."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text))


class PasteParser(XTermParser):
    """Textual's parser, given each bracketed paste whole and cleaned (see the module's docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pasting = False
        self._pasted = ""
        self._tail = ""  # the last characters passed on outside a paste: a START may be split across reads

    def feed(self, data: str):
        if not data:  # end of input: a paste cut short is still delivered, then the parser ends
            events = self._pass(clean(self._pasted) + END if self._pasting else "")
            self._pasting, self._pasted = False, ""
            return events + list(super().feed(""))
        passed = []
        while data:
            if self._pasting:
                self._pasted += data
                end = self._pasted.find(END)
                if end < 0:
                    break  # the rest of the paste is still to come
                passed.append(clean(self._pasted[:end]) + END)
                data = self._pasted[end + len(END) :]
                self._pasting, self._pasted = False, ""
                continue
            window = self._tail + data
            start = window.find(START)
            if start < 0:
                passed.append(data)
                self._tail = window[-(len(START) - 1) :]
                break
            cut = start + len(START) - len(self._tail)
            passed.append(data[:cut])
            data = data[cut:]
            self._pasting, self._tail = True, ""
        return self._pass("".join(passed))

    def _pass(self, text: str) -> list:
        return list(super().feed(text)) if text else []  # an empty feed would end the parser


def install() -> None:
    """Make Textual's terminal drivers read their input with PasteParser (they look the name up when
    their input thread starts)."""
    for name in DRIVERS:
        try:
            module = importlib.import_module(name)
        except ImportError:  # not on this platform, or textual-serve is not installed
            continue
        if getattr(module, "XTermParser", None) is XTermParser:
            module.XTermParser = PasteParser  # type: ignore[attr-defined]  # the stubs declare no such attribute
