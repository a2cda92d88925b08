"""The download screen: per-file progress bars (bytes, speed, ETA) while a model is fetched.

Push it with a `hub.Plan`. It dismisses with the local paths (`hub.ModelFiles`), or with None
when the user pressed Esc or the download failed; a notification then says what to do.

A gated repo (the z-lab Qwen3.6 drafters) the token cannot read stops the download before any
transfer: the screen says what to do and shows a token field. Enter stores the token the way
`hf auth login` does (hub.save_token), checks access again and resumes the download.

    files = await app.push_screen_wait(DownloadScreen(plan))
"""

from __future__ import annotations

import threading
from typing import Callable

from textual import work
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Label, ProgressBar

from dflash_chat.errors import one_line
from dflash_chat.models import hub
from dflash_chat.models.sizes import rate_text, size_text
from dflash_chat.ui.notices import PlainNotices


class DownloadScreen(PlainNotices, ModalScreen["hub.ModelFiles | None"]):
    BINDINGS = [Binding("escape", "cancel", "Cancel download", id="download-cancel")]

    class FileProgressed(Message):
        def __init__(self, progress: hub.Progress) -> None:
            super().__init__()
            self.progress = progress

    class Gated(Message):
        """A gated repo the token cannot read (or a token the Hub refused): ask for a token."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class TokenSaved(Message):
        """The token was stored and opens every gated repo of the plan: download again."""

    class Finished(Message):
        """files on success; error is None when the user cancelled."""

        def __init__(self, files: hub.ModelFiles | None, error: str | None) -> None:
            super().__init__()
            self.files = files
            self.error = error

    def __init__(
        self,
        plan: hub.Plan,
        *,
        title: str = "Downloading the model",
        disk_free: Callable | None = None,
    ) -> None:
        super().__init__()
        self.plan = plan
        self.title_text = title
        self.disk_free = disk_free
        self.cancel = threading.Event()
        self._rows: dict[str, int] = {}

    def compose(self):
        with Vertical(id="download-box"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Label("Looking up the files…", id="download-summary", markup=False)
            yield VerticalScroll(id="download-files")
            with Vertical(id="download-gated"):
                yield Label("", id="download-gated-text")
                yield Input(
                    placeholder="hf_…  (a read token from huggingface.co/settings/tokens; Enter saves it)",
                    password=True,
                    id="download-token",
                )
            yield Label("Esc cancels; the files fetched so far are kept and resume next time", id="download-hint")

    def on_mount(self) -> None:
        self._show(self.plan)
        self.fetch()

    @work(thread=True, exclusive=True, group="download")
    def fetch(self) -> None:
        try:
            files = hub.download(self.plan, progress=self._report, cancel=self.cancel, disk_free=self.disk_free)
        except hub.DownloadCancelled:
            self.post_message(self.Finished(None, None))
        except hub.GatedRepoAccessError as exc:
            self.post_message(self.Gated(str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown to the user instead of a crashed worker
            self.post_message(self.Finished(None, one_line(exc, "the download")))
        else:
            self.post_message(self.Finished(files, None))

    @work(thread=True, exclusive=True, group="token")
    def save_token(self, token: str) -> None:
        """Store the token (huggingface_hub's login checks it with the Hub), then check access again."""
        try:
            hub.save_token(token)
            hub.check_access(self.plan)
        except hub.HubError as exc:
            self.post_message(self.Gated(one_line(exc, "the token")))
        else:
            self.post_message(self.TokenSaved())

    def _report(self, progress: hub.Progress) -> None:
        self.post_message(self.FileProgressed(progress))  # from the worker thread; never blocks

    def _show(self, plan: hub.Plan) -> None:
        todo = plan.missing_bytes()
        fetch = f", {size_text(todo)} to download" if todo else ", all cached"
        self.query_one("#download-summary", Label).update(
            f"{len(plan.files)} files, {size_text(plan.total_bytes)}{fetch} into {plan.cache_dir}"
        )
        rows = []
        for index, file in enumerate(plan.files):
            self._rows[file.key] = index
            rows.append(
                Vertical(
                    Label(f"{file.repo}/{file.filename}", classes="download-name", markup=False),
                    ProgressBar(total=max(file.size, 1), show_eta=False, id=f"download-bar-{index}"),
                    Label("cached" if file.cached else "waiting", id=f"download-stat-{index}", classes="download-stat"),
                    classes="download-row",
                )
            )
        self.query_one("#download-files", VerticalScroll).mount_all(rows)

    def on_download_screen_file_progressed(self, message: FileProgressed) -> None:
        p = message.progress
        index = self._rows.get(p.file.key)
        if index is None:
            return
        self.query_one(f"#download-bar-{index}", ProgressBar).update(progress=p.done)
        self.query_one(f"#download-stat-{index}", Label).update(describe(p))

    def on_download_screen_gated(self, message: Gated) -> None:
        self.query_one("#download-gated-text", Label).update(message.text)
        self.query_one("#download-gated").add_class("shown")
        field = self.query_one("#download-token", Input)
        field.disabled = False
        field.value = ""
        field.focus()
        self.query_one("#download-hint", Label).update("Esc cancels; nothing was downloaded from the gated repo yet")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "download-token" or not event.value.strip():
            return
        event.input.disabled = True
        self.query_one("#download-gated-text", Label).update("Checking the token with the Hub…")
        self.save_token(event.value)

    def on_download_screen_token_saved(self, message: TokenSaved) -> None:
        self.query_one("#download-gated").remove_class("shown")
        self.query_one("#download-hint", Label).update(
            "Token saved (as `hf auth login` does). Esc cancels; the files fetched so far are kept"
        )
        self.fetch()

    def on_download_screen_finished(self, message: Finished) -> None:
        if message.files is not None:
            self.dismiss(message.files)
            return
        if message.error is None:
            self.notify(
                "Download cancelled. The partial files are kept: start it again to resume.",
                title="Download",
                severity="warning",
            )
        else:
            self.notify(message.error, title="Download failed", severity="error", timeout=15)
        self.dismiss(None)

    def on_unmount(self) -> None:
        self.cancel.set()  # quitting mid-download: the worker thread stops at its next chunk

    def action_cancel(self) -> None:
        self.cancel.set()
        self.query_one("#download-hint", Label).update("Cancelling…")


def describe(p: hub.Progress) -> str:
    """'1.2 GB / 16.5 GB · 45 MB/s · 5:12 left', or the file's state."""
    if p.status in ("cached", "done"):
        return f"{size_text(p.total)} · {p.status}"
    if p.status == "verifying":
        return f"{size_text(p.total)} · checking the hash…"
    if p.status == "resuming":
        return f"resuming from {size_text(p.done)} of {size_text(p.total)}…"
    parts = [f"{size_text(p.done)} / {size_text(p.total)}", rate_text(p.speed)]
    if p.eta is not None:
        parts.append(f"{clock(p.eta)} left")
    return " · ".join(parts)


def clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
