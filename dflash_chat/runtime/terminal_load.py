"""The model loader on a terminal (`serve`, `run`): the choice said in a line, missing files fetched
with `pull`'s bars, the loading line drawn on stderr; `done` is set once the model loaded or failed.

It owns a runtime/loader.py ModelLoader: every event is applied (`handle`) on the worker thread that
posts it, as nothing else here touches the loader meanwhile.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from dflash_chat.errors import one_line
from dflash_chat.runtime import events
from dflash_chat.runtime.loader import LoadOptions, ModelLoader, Spawn
from dflash_chat.runtime.model_source import ModelSource, Pick
from dflash_chat.runtime.progress import LoadLine, download_with_bars


def in_a_thread(body: Callable[[], None], group: str) -> None:
    threading.Thread(target=body, daemon=True).start()


def at_once(body: Callable[[], None], group: str) -> None:
    body()


class TerminalLoad:
    def __init__(
        self,
        options: LoadOptions,
        *,
        spawn: Spawn = in_a_thread,
        quiet: bool = False,
        name: str | None = None,
        loaded: Callable[[ModelLoader, float], None] = lambda loader, seconds: None,
        failed: Callable[[str], None] = lambda error: None,
    ) -> None:
        """`name`: the loading line's (default: the loader's). `loaded(loader, seconds)` once the model is
        ready, `failed(error)` when it cannot be had: each before `done` is set."""
        self.loader = ModelLoader(self.post, spawn, options)
        self.quiet = quiet
        self.name = name
        self.loaded, self.failed = loaded, failed
        self.done = threading.Event()
        self.error: str | None = None
        self.cause: BaseException | None = None  # what made the load fail, when it raised
        self._line: LoadLine | None = None
        self._total = 0

    def begin(self, request: ModelSource | Pick) -> TerminalLoad:
        self.loader.begin(request)
        return self

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def post(self, event: events.LoadEvent) -> None:
        if not self.loader.handle(event):
            return
        match event:
            case events.ModelChosen():
                self.say(event.chosen.explanation)
            case events.DownloadNeeded():
                self._download(event)
            case events.LoadProgress():
                self._progress(event)
            case events.ModelLoaded():
                if self._line is not None:
                    self._line.close(self._total)
                for note in getattr(event.model, "notes", ()):  # a loaded pair's (engine/load.py)
                    self.say(f"note: {note}")
                self.loaded(self.loader, event.seconds)
                self.done.set()
            case events.ModelFailed():
                self.fail(event.error, event.cause)
            case events.ModelUnavailable():
                self.fail(event.error)

    def _progress(self, event: events.LoadProgress) -> None:
        if self._line is None:
            self._line = LoadLine(self.name or self.loader.name())
        self._total = event.total
        self._line(event.done, event.total)

    def _download(self, event: events.DownloadNeeded) -> None:
        try:
            files = download_with_bars(event.plan)
        except Exception as exc:  # noqa: BLE001 - said in one line; the owner stops
            self.fail(one_line(exc, "downloading the model"))
            return
        self.loader.downloaded(event.request, event.choice, files)

    def fail(self, error: str, cause: BaseException | None = None) -> None:
        self.error, self.cause = error, cause
        self.failed(error)
        self.done.set()
