"""The side panel: speed and draft acceptance (live while an answer streams, then the
engine's own figures, or a server's with where they came from), tokens, model and memory, and the
thinking switch with the mean acceptance of the answers with thinking off and on. Answers to prompts with images
are kept out of that comparison and shown beside it ("acceptance, images"): the drafters were trained on text and
see an image only through the target's features, so those answers would move it for a reason that is not thinking."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Label, Sparkline, Static, Switch

from dflash_chat.engine.events import GenerationStats
from dflash_chat.runtime.live_stats import LiveStats

BARS = " ▁▂▃▄▅▆▇█"
DASH = "—"
NO_FIGURES = "none reported"  # a server that says nothing of its drafts


def format_rate(value: float) -> str:
    return f"{value * 100:.1f} %"


def format_speed(value: float) -> str:
    return f"{value:.1f}"


def format_draft(f: LiveStats | GenerationStats, live: bool) -> str:
    """The draft setting and the drafts verified per step: the latest step's while an answer streams
    ("auto · 7"), the mean over the answer after it ("auto · 6.2"); "off" for plain decoding. A server
    that does not say its setting gets the figure alone."""
    if f.draft == "off":
        return "off"
    if not f.steps:
        return f.draft or DASH
    per = str(f.last_drafted) if live and isinstance(f, LiveStats) else f"{f.mean_draft_length:.1f}"
    return f"{f.draft} · {per}" if f.draft else per


def format_seconds(seconds: float) -> str:
    """A short time as people read it: "0.84 s", "12 ms", and "< 1 ms" (a first token from a prompt the engine
    already held, as after Ctrl+R), never "0.00 s"."""
    if seconds >= 0.1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.0005 else "< 1 ms"


def method_rows(f: LiveStats | GenerationStats) -> tuple[tuple[str, str], ...]:
    """Which methods drafted, a row each, by their share of the steps, the largest first
    (("drafted by mtp", "62%"), ("drafted by lookup", "30%")); none when none did (plain decoding, or a
    server's answer). A row each, so that no value is wider than the narrowest panel's column."""
    drafting = sorted(((s.steps, name) for name, s in f.methods.items() if name != "plain"), reverse=True)
    if not drafting or not f.steps:
        return ()
    return tuple((f"drafted by {name}", f"{steps / f.steps:.0%}") for steps, name in drafting)


def histogram_bars(counts: list[int]) -> str:
    """One bar per acceptance length (0..B-1), scaled to the tallest."""
    top = max(counts, default=0)
    if top == 0:
        return ""
    # a length that happened at all gets at least the lowest bar
    return "".join(BARS[max(1, round(c / top * (len(BARS) - 1)))] if c else BARS[0] for c in counts)


class Rows:
    """(name, value) rows, each on one line with the name at the left and the value at the right where both fit
    the column, else the value on a line of its own under its name (a long model name at 80 columns): never cut,
    whatever the panel's width. Values hold model names and paths: plain text, never markup."""

    def __init__(self, rows: tuple[tuple[str, str], ...]) -> None:
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for name, value in self.rows:
            gap = width - cell_len(name) - cell_len(value)
            if gap >= 1:
                yield Text.assemble((name, "dim"), " " * gap, value, no_wrap=True)
            else:
                yield Text(name, style="dim", no_wrap=True, overflow="fold")
                yield Text(value, justify="right", overflow="fold")


def _section(title: str, *figures: Widget) -> Vertical:
    return Vertical(Label(title, classes="section-title"), *figures, classes="section")


class StatsPanel(VerticalScroll):
    can_focus = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.histogram: list[int] = []
        self.by_thinking: dict[bool, list[float]] = {True: [], False: []}
        self.with_images: list[float] = []  # the acceptance of answers to prompts with images
        self._rows: dict[str, tuple[tuple[str, str], ...]] = {}  # section id -> its (name, value) rows on screen

    def compose(self):
        yield _section("Speed", Static(id="speed"))
        yield _section("Draft", Static(id="draft"), Sparkline([], id="acceptance-sparkline"), Static(id="histogram"))
        yield _section("Tokens", Static(id="tokens"))
        yield _section("Model", Static(id="model"))
        with Vertical(classes="section"):
            with Horizontal(id="thinking-row"):
                yield Label("Thinking", id="thinking-label")
                yield Switch(id="thinking-switch")
            yield Static(id="thinking-effect")

    def on_mount(self) -> None:
        self.query_one(Sparkline).tooltip = "tokens per verify step, recent steps"
        self.show_figures(None)
        self.show_model()
        self._show_thinking_effect()

    # figures

    @property
    def shown(self) -> dict[str, str]:
        """Row name -> the text on screen, over every section."""
        return {name: value for rows in self._rows.values() for name, value in rows}

    def show_live(self, live: LiveStats, speculative: bool) -> None:
        self.show_figures(live, live=True, speculative=speculative)
        self._show_sparkline(live.recent_lengths if speculative else [])

    def show_final(
        self,
        stats: GenerationStats,
        thinking: bool | None = None,
        *,
        remote: bool = False,
        source: str | None = None,
        images: bool = False,
    ) -> None:
        """The answer's figures; `remote`: a server's answer, its draft figures from `source` (or none); `images`:
        its prompt held images."""
        self.show_figures(stats, speculative=stats.speculative, source=(source or NO_FIGURES) if remote else None)
        self.histogram = list(stats.acceptance_histogram)
        self._show_histogram()
        if thinking is not None and stats.speculative and stats.drafted:
            (self.with_images if images else self.by_thinking[thinking]).append(stats.acceptance_rate)
            self._show_thinking_effect()

    def show_figures(
        self,
        f: LiveStats | GenerationStats | None,
        *,
        live: bool = False,
        speculative: bool = False,
        source: str | None = None,
    ) -> None:
        """Speed, draft and token rows from LiveStats (`live`) or the engine's GenerationStats; None clears them.
        `source`: where a server's draft figures came from (a row of its own)."""
        # called for every streamed chunk: same-sized tables, so no layout pass, and unchanged ones are skipped
        self._show_rows(
            "speed",
            (
                ("tok/s (live)" if live else "tok/s (last)", format_speed(f.decode_tokens_per_s) if f else DASH),
                ("first token", format_seconds(f.ttft_s) if f and f.ttft_s is not None else DASH),
            ),
            layout=False,
        )
        spec = f if speculative else None  # the figures of an answer that drafted
        draft = (
            ("acceptance", format_rate(spec.acceptance_rate) if spec and spec.drafted else DASH),  # of no drafts: none
            ("tokens/step", f"{spec.mean_acceptance_length:.2f}" if spec and spec.steps else DASH),
            ("drafts/step", format_draft(f, live) if f is not None else DASH),
        )
        extra = (method_rows(spec) if spec else ()) + ((("from", source),) if source else ())
        self._show_rows("draft", draft + extra, layout=False)
        image_tokens = getattr(f, "image_tokens", 0)  # the engine's figures of a prompt with images
        images = (
            (("images", f"{image_tokens} · {format_seconds(getattr(f, 'vision_s', 0.0))}"),) if image_tokens else ()
        )
        self._show_rows(
            "tokens",
            (
                ("prompt", f"{f.prompt_tokens} ({f.reused_tokens} reused)" if f else DASH),
                *images,  # their tokens (in the prompt's) and the vision tower's time
                ("new", str(f.new_tokens) if f else DASH),
            ),
            layout=False,
        )
        if f is None:
            self._show_sparkline([])
            self.histogram = []
            self._show_histogram()

    def _show_rows(self, section: str, rows: tuple[tuple[str, str], ...], *, layout: bool = True) -> None:
        before = self._rows.get(section)
        if before == rows:
            return
        self._rows[section] = rows
        resized = before is None or len(before) != len(rows)
        self.query_one(f"#{section}", Static).update(Rows(rows), layout=layout or resized)

    def _show_sparkline(self, lengths: list[int]) -> None:
        sparkline = self.query_one(Sparkline)
        sparkline.data = list(lengths)
        sparkline.display = bool(lengths)

    def _show_histogram(self) -> None:
        bars = histogram_bars(self.histogram)
        text = Text()
        if bars:  # the label over its bars: one row of both is wider than the panel's column at 80 columns
            text.append("accepted/step\n", style="dim")
            text.append(bars)
        self.query_one("#histogram", Static).update(text)

    # model, memory, thinking

    def show_model(self, rows: tuple[tuple[str, str], ...] = (), note: str = "") -> None:
        """What answers, as the backend describes it (chat/backends/base.py: rows); without rows, `note`."""
        if not rows:
            self._rows.pop("model", None)
            self.query_one("#model", Static).update(Text(note or "no model loaded", style="dim"))
            return
        self._show_rows("model", tuple(rows))

    def set_thinking(self, on: bool) -> None:
        switch = self.query_one(Switch)
        if switch.value != on:
            with switch.prevent(Switch.Changed):
                switch.value = on

    def _show_thinking_effect(self) -> None:
        rows = tuple(
            (f"acceptance {label}", format_rate(sum(rates) / len(rates)))
            for mode, label in ((False, "off"), (True, "on"))
            if (rates := self.by_thinking[mode])
        )
        if self.with_images:
            rows += (("acceptance, images", format_rate(sum(self.with_images) / len(self.with_images))),)
        if rows:
            self._show_rows("thinking-effect", rows)
        else:
            self._rows.pop("thinking-effect", None)
            self.query_one("#thinking-effect", Static).update(Text("from the next answer", style="dim"))
