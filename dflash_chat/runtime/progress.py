"""Progress as a person sees it: the figures of a model loading, a loading line on stderr, download bars.

Below the commands, the UI and `serve`, which all show it: the chat's load bar (ui/widgets/load_bar.py)
shows `progress_line`; `run` and `serve` draw `LoadLine` while weights are placed, and `pull` and
`serve` fetch with `download_with_bars`.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from dflash_chat.models.sizes import rate_text, size_text

if TYPE_CHECKING:
    from dflash_chat.models import hub


def progress_line(done: int, total: int, seconds: float) -> str:
    """'1.2 GB / 16.5 GB · 1.1 GB/s · 14 s left': bytes placed, their rate, the time left at that rate."""
    rate = done / max(seconds, 1e-9)
    left = f" · {max(total - done, 0) / rate:.0f} s left" if rate > 0 and done < total else ""
    return f"{size_text(done)} / {size_text(total)} · {rate_text(rate)}{left}"


class LoadLine:
    """Call with (bytes placed, bytes in all); redraws at most ten times a second, only on a terminal."""

    def __init__(self, what: str, stream: TextIO | None = None) -> None:
        self.what = what
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.started = time.perf_counter()
        self.drawn = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if not self.live or (now - self.drawn < 0.1 and done < total):
            return
        self.drawn = now
        self.stream.write(f"\rloading {self.what}: {progress_line(done, total, now - self.started)}\x1b[K")
        self.stream.flush()

    def summary(self, total: int) -> str:
        seconds = time.perf_counter() - self.started
        return f"loaded {self.what}: {size_text(total)} in {seconds:.1f} s ({rate_text(total / max(seconds, 1e-9))})"

    def close(self, total: int) -> None:
        if self.live:
            self.stream.write("\r" + self.summary(total) + "\x1b[K\n")
            self.stream.flush()


def download_with_bars(plan: hub.Plan) -> hub.ModelFiles:
    """Fetch the plan's files with a bar each (rich); Ctrl-C leaves the partial files for the next run."""
    from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    from dflash_chat.models import hub

    class Bytes(ProgressColumn):
        """Done / total and speed, in the app's one byte format (models/sizes.py)."""

        def render(self, task) -> Text:
            speed = f"  {rate_text(task.speed)}" if task.speed else ""
            return Text(f"{size_text(task.completed)} / {size_text(task.total or 0)}{speed}")

    columns = (TextColumn("{task.description}"), BarColumn(), Bytes(), TimeRemainingColumn())
    with Progress(*columns) as bar:
        tasks = {f.key: bar.add_task(f.filename, total=f.size) for f in plan.files}

        def show(event: hub.Progress) -> None:
            bar.update(tasks[event.file.key], completed=event.done)

        try:
            return hub.download(plan, progress=show)
        except KeyboardInterrupt:  # Ctrl-C: the partial file stays for the next run
            raise hub.DownloadCancelled() from None
