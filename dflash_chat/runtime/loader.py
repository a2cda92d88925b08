"""The model loader: choose a pair for this machine, fetch what is missing, load it, with progress.

One lifecycle for the chat app, `serve` and `run`. Given a `Pick`, the model manager
(runtime/model_manager.py) chooses in a worker (the probe imports torch) and the loader posts
ModelChosen, then DownloadNeeded when files are missing (the owner fetches them: the download screen,
or `pull`'s bars; then it calls `downloaded`) or ModelReady. Given files (a ModelSource) it loads them
at once in another worker, posting LoadProgress, then ModelLoaded or ModelFailed. The owner applies each
event with `handle` on its own thread (False: a worker of an earlier request posted it) and reads
`status` and `pair`. No wording here beyond the model's name: whoever shows the events words them.
torch is imported only inside the workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dflash_chat.engine.rules import PREFIX_CACHE_MIB_DEFAULT, PREFIX_CACHE_RAM_MIB_DEFAULT
from dflash_chat.errors import one_line
from dflash_chat.runtime.events import (
    DownloadNeeded,
    LoadEvent,
    LoadProgress,
    ModelChosen,
    ModelFailed,
    ModelLoaded,
    ModelReady,
    ModelUnavailable,
    Status,
)
from dflash_chat.runtime.model_source import ModelSource, Pick, load_device, vision_to_load

if TYPE_CHECKING:
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.models.hardware import Choice
    from dflash_chat.models.hub import ModelFiles
    from dflash_chat.runtime.model_manager import Chosen
    from dflash_chat.settings import Settings

PROGRESS_EVERY_S = 0.1  # loading progress is posted at most this often

Spawn = Callable[[Callable[[], None], str], None]  # (worker body, group): "model" for every loader job


@dataclass(frozen=True)
class LoadOptions:
    """How a model loads when its source does not say: the context to allocate, decode path, drafts, and which
    method drafts them."""

    context_length: int
    decode: str = "auto"
    draft: str | int = "auto"
    device: str | None = None  # over where the source was placed (`run --device`)
    speculate: str = "auto"
    prefix_cache_mib: int = (
        PREFIX_CACHE_MIB_DEFAULT  # MiB of prompt checkpoints for branching requests (engine/prefix_cache.py)
    )
    prefix_cache_ram_mib: int = PREFIX_CACHE_RAM_MIB_DEFAULT  # MiB of parked conversations (engine/parked.py)
    vision: str = "auto"  # the vision setting: whether the pick (or a folder target) loads its vision tower

    @classmethod
    def of(cls, settings: Settings) -> LoadOptions:
        return cls(
            settings.context_length,
            settings.decode,
            settings.draft,
            speculate=settings.speculate,
            prefix_cache_mib=settings.prefix_cache_mib,
            prefix_cache_ram_mib=settings.prefix_cache_ram_mib,
            vision=settings.vision,
        )


class ModelLoader:
    def __init__(self, post: Callable[[LoadEvent], None], spawn: Spawn, options: LoadOptions) -> None:
        self.post, self.spawn = post, spawn
        self.options = options  # the owner keeps it current; it applies to the next choice or load
        self.request: ModelSource | Pick | None = None  # what was asked for: files, or a Pick to choose
        self.source: ModelSource | None = None  # the files being loaded
        self.chosen: Chosen | None = None  # the model manager's choice, when it chose
        self.pair: LoadedPair | None = None  # once loaded
        self.status = Status()

    def name(self) -> str:
        """'Qwen3.6-27B Q4_K_M · drafter Q8_0' (a choice), 'tiny demo model', or the files' name."""
        source = self.source
        if source is not None and source.demo:
            return "tiny demo model"
        if source is not None and source.title:
            return f"{source.title} {source.quant_label}".strip()
        if self.pair is not None:
            return self.pair.target_name
        return source.target if source is not None else "no model"

    # the owner's thread

    def begin(self, request: ModelSource | Pick) -> None:
        """Choose and fetch (a Pick), or load the files given. What workers still post for an earlier
        request is stale from now on."""
        self.request, self.chosen = request, None
        if isinstance(request, ModelSource):
            self.load(request)
            return
        self.source, self.pair = None, None
        self.status = Status("choosing")
        context, vision = self.options.context_length, self.options.vision
        self.spawn(lambda: self._choose(request, context, vision), "model")

    def load(self, source: ModelSource) -> None:
        self.source, self.pair = source, None
        explanation = self.chosen.explanation if self.chosen is not None else ""
        self.status = Status("loading", explanation=explanation, what=self.name(), demo=source.demo)
        options = replace(self.options, context_length=source.context or self.options.context_length)
        self.spawn(lambda: self._load(source, options), "model")

    def reload_for_context(self) -> bool:
        """The context length changed: a choice may change, loaded files load again (as a new request:
        what workers still post for the old one is then stale). False when the request pins its own."""
        if isinstance(self.request, Pick) and self.request.context is None:
            self.begin(replace(self.request))
            return True
        if self.source is not None and self.source.context is None:
            self.load(replace(self.source))
            return True
        return False

    def reload(self) -> None:
        """What was asked for, chosen (a Pick) or loaded (files) again under the current options, as a new request:
        the `vision` setting changed, and with it what the pick loads."""
        if self.request is not None:
            self.begin(replace(self.request))

    def downloaded(self, request: Pick, choice: Choice, files: ModelFiles | None) -> None:
        """The owner fetched a DownloadNeeded's files (None: it stopped): load them."""
        from dflash_chat.runtime.model_manager import label, resume_advice, source_for

        if request is not self.request:
            return
        if files is not None:
            self.load(source_for(choice, files))
            return
        self.status = Status("not_downloaded", what=label(choice), advice=resume_advice(choice))

    def handle(self, event: LoadEvent) -> bool:
        """Apply `event`; False when it is stale (then nothing changed)."""
        if isinstance(event, (ModelChosen, DownloadNeeded, ModelReady, ModelUnavailable)):
            if event.request is not self.request:
                return False
            self._chose(event)
        elif event.source is not self.source:
            return False  # loaded for files no longer asked for; dropping it frees its memory
        elif isinstance(event, ModelLoaded):
            self.pair = event.model  # type: ignore[assignment]  # a loader's source is a ModelSource
            self.status = Status("ready", what=self.name(), demo=event.source.demo)
        elif isinstance(event, ModelFailed):
            self.status = Status("failed", error=event.error)
        return True

    def _chose(self, event: ModelChosen | DownloadNeeded | ModelReady | ModelUnavailable) -> None:
        from dflash_chat.runtime.model_manager import label

        if isinstance(event, ModelChosen):
            self.chosen = event.chosen
            self.status = Status("checking", explanation=event.chosen.explanation)
        elif isinstance(event, DownloadNeeded):
            self.status = Status(
                "downloading",
                explanation=self.status.explanation,
                what=label(event.choice),
                size=event.plan.missing_bytes(),
            )
        elif isinstance(event, ModelReady):
            self.load(event.source)
        else:
            self.status = Status("unavailable", error=event.error)

    # worker bodies (they only post)

    def _choose(self, pick: Pick, context_length: int, vision: str = "auto") -> None:
        post = self.post
        try:
            from dflash_chat.models import hub
            from dflash_chat.runtime import model_manager

            chosen = model_manager.choose(pick, context_length, vision=vision)
            post(ModelChosen(pick, chosen))
            if chosen.demo is not None:
                post(ModelReady(pick, chosen.demo))
                return
            assert chosen.choice is not None  # not the demo: a catalog choice
            plan = model_manager.plan_files(chosen.choice)
            if plan.to_fetch:
                post(DownloadNeeded(pick, chosen.choice, plan))
                return
            files = hub.download(plan)  # everything is cached: this only links the snapshot files
            post(ModelReady(pick, model_manager.source_for(chosen.choice, files)))
        except Exception as exc:  # noqa: BLE001 - said to the user, the app carries on
            post(ModelUnavailable(pick, one_line(exc, "choosing a model")))

    def _load(self, source: ModelSource, options: LoadOptions) -> None:
        post = self.post
        started = time.perf_counter()
        last = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - last[0] >= PROGRESS_EVERY_S or done >= total:
                last[0] = now
                post(LoadProgress(source, done, total, now - started))

        try:
            from dflash_chat.engine.load import load_pair  # the first torch import happens here

            pair = load_pair(
                source.target,
                source.drafter,
                tokenizer=source.tokenizer,
                device=options.device or load_device(source),
                max_context=options.context_length,
                decode=options.decode,
                draft=options.draft,
                speculate=options.speculate,
                checkpoint_budget=options.prefix_cache_mib * 2**20,
                park_budget=options.prefix_cache_ram_mib * 2**20,
                progress=progress,
                vision=vision_to_load(source, options.vision),
            )
        except Exception as exc:  # noqa: BLE001 - said to the user, the app carries on
            post(ModelFailed(source, one_line(exc, "loading the model"), exc))
            return
        post(ModelLoaded(source, pair, time.perf_counter() - started))
