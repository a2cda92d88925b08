"""A progress bar under the chat while a model loads: bytes placed of all, rate, time left."""

from __future__ import annotations

from rich.text import Text
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from dflash_chat.runtime.progress import progress_line


class LoadBar(Horizontal):
    def compose(self):
        yield Label(id="load-what")
        yield ProgressBar(show_eta=False, id="load-progress")
        yield Label(id="load-figures")

    def show(self, what: str, done: int, total: int, seconds: float) -> None:
        self.display = True
        self.query_one("#load-what", Label).update(Text(f"Loading {what}"))  # a model's name is never markup
        self.query_one(ProgressBar).update(total=max(total, 1), progress=min(done, total))
        self.query_one("#load-figures", Label).update(Text(progress_line(done, total, seconds)))

    @property
    def figures(self) -> str:
        return str(self.query_one("#load-figures", Label).render())

    def hide(self) -> None:
        self.display = False
