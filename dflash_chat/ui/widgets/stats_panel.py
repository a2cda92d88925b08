"""The side panel: speed and draft acceptance (live while an answer streams, then the
engine's own figures), tokens, model and memory, and the thinking switch."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Label, Sparkline, Static, Switch

from dflash_chat.chat.live_stats import LiveStats
from dflash_chat.chat.memory import MemoryUse, gigabytes
from dflash_chat.engine.events import GenerationStats

BARS = " ▁▂▃▄▅▆▇█"
DASH = "—"


@dataclass(frozen=True)
class Figures:
    """What the speed and draft sections show, from live counts or final stats."""

    tokens_per_s: float
    ttft_s: float | None
    acceptance_rate: float
    mean_acceptance_length: float
    prompt_tokens: int
    reused_tokens: int
    new_tokens: int
    speculative: bool
    live: bool

    @classmethod
    def from_live(cls, live: LiveStats, speculative: bool) -> Figures:
        return cls(live.tokens_per_s, live.ttft_s, live.acceptance_rate, live.mean_acceptance_length,
                   live.prompt_tokens, live.reused_tokens, live.new_tokens, speculative, live=True)

    @classmethod
    def from_stats(cls, stats: GenerationStats) -> Figures:
        return cls(stats.decode_tokens_per_s, stats.ttft_s, stats.acceptance_rate,
                   stats.mean_acceptance_length, stats.prompt_tokens, stats.reused_tokens,
                   stats.new_tokens, stats.speculative, live=False)


def format_rate(value: float) -> str:
    return f"{value * 100:.1f} %"


def format_speed(value: float) -> str:
    return f"{value:.1f}"


def histogram_bars(counts: list[int]) -> str:
    """One bar per acceptance length (0..B-1), scaled to the tallest."""
    top = max(counts, default=0)
    if top == 0:
        return ""
    # a length that happened at all gets at least the lowest bar
    return "".join(BARS[max(1, round(c / top * (len(BARS) - 1)))] if c else BARS[0] for c in counts)


def _rows(shown: dict[str, str], *rows: tuple[str, str]) -> Table:
    shown.update(rows)
    table = Table.grid(expand=True)
    table.add_column(style="dim", no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    for name, value in rows:
        table.add_row(name, value)
    return table


class StatsPanel(VerticalScroll):
    can_focus = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.figures: Figures | None = None
        self.histogram: list[int] = []
        self.by_thinking: dict[bool, list[float]] = {True: [], False: []}
        self.shown: dict[str, str] = {}  # row name -> the text on screen

    def compose(self):
        with Vertical(classes="section"):
            yield Label("Speed", classes="section-title")
            yield Static(id="speed")
        with Vertical(classes="section"):
            yield Label("Draft", classes="section-title")
            yield Static(id="draft")
            yield Sparkline([], id="acceptance-sparkline")
            yield Static(id="histogram")
        with Vertical(classes="section"):
            yield Label("Tokens", classes="section-title")
            yield Static(id="tokens")
        with Vertical(classes="section"):
            yield Label("Model", classes="section-title")
            yield Static(id="model")
        with Vertical(classes="section"):
            with Horizontal(id="thinking-row"):
                yield Label("Thinking", id="thinking-label")
                yield Switch(id="thinking-switch")
            yield Static(id="thinking-effect")

    def on_mount(self) -> None:
        self.query_one(Sparkline).tooltip = "tokens per verify step, recent steps"
        self.show_figures(None)
        self.show_model(None)
        self._show_thinking_effect()

    # figures

    def show_live(self, live: LiveStats, speculative: bool) -> None:
        self.show_figures(Figures.from_live(live, speculative))
        self._show_sparkline(live.recent_lengths if speculative else [])

    def show_final(self, stats: GenerationStats, thinking: bool | None = None) -> None:
        self.show_figures(Figures.from_stats(stats))
        self.histogram = list(stats.acceptance_histogram)
        self._show_histogram()
        if thinking is not None and stats.speculative and stats.drafted:
            self.by_thinking[thinking].append(stats.acceptance_rate)
            self._show_thinking_effect()

    def show_figures(self, figures: Figures | None) -> None:
        self.figures = figures
        f = figures
        speed_label = "tok/s (live)" if f and f.live else "tok/s (last)"
        self.shown.pop("tok/s (live)" if speed_label.endswith("(last)") else "tok/s (last)", None)
        self.query_one("#speed", Static).update(_rows(
            self.shown,
            (speed_label, format_speed(f.tokens_per_s) if f else DASH),
            ("first token", f"{f.ttft_s:.2f} s" if f and f.ttft_s is not None else DASH),
        ))
        drafting = f is not None and f.speculative
        self.query_one("#draft", Static).update(_rows(
            self.shown,
            ("acceptance", format_rate(f.acceptance_rate) if drafting else DASH),
            ("tokens/step", f"{f.mean_acceptance_length:.2f}" if drafting else DASH),
        ))
        self.query_one("#tokens", Static).update(_rows(
            self.shown,
            ("prompt", f"{f.prompt_tokens} ({f.reused_tokens} reused)" if f else DASH),
            ("new", str(f.new_tokens) if f else DASH),
        ))
        if f is None:
            self._show_sparkline([])
            self.histogram = []
            self._show_histogram()

    def _show_sparkline(self, lengths: list[int]) -> None:
        sparkline = self.query_one(Sparkline)
        sparkline.data = list(lengths)
        sparkline.display = bool(lengths)

    def _show_histogram(self) -> None:
        bars = histogram_bars(self.histogram)
        text = Text()
        if bars:
            text.append("accepted/step ", style="dim")
            text.append(bars)
        self.query_one("#histogram", Static).update(text)

    # model, memory, thinking

    def show_model(self, pair, memory: MemoryUse | None = None, note: str = "", source=None) -> None:
        """The loaded pair; `source` (a ModelSource) adds the model manager's title and quants."""
        if pair is None:
            self.query_one("#model", Static).update(Text(note or "no model loaded", style="dim"))
            return
        title = getattr(source, "title", "")
        drafter = pair.drafter_name.rsplit("/", 1)[-1] if pair.drafter_name else "none (plain decoding)"
        rows = [("target", title or pair.target_name), ("drafter", drafter)]
        if quant := getattr(source, "quant_label", ""):
            rows.append(("quant", quant))
        dtype = getattr(pair, "dtype", None)
        rows.append(("device", f"{pair.device}" + (f" · {_short(dtype)}" if dtype else "")))
        if memory is not None:
            rows.append((memory.kind, f"{gigabytes(memory.used_bytes)} / {gigabytes(memory.total_bytes)} GB"))
        self.query_one("#model", Static).update(_rows(self.shown, *rows))

    def set_thinking(self, on: bool) -> None:
        switch = self.query_one(Switch)
        if switch.value != on:
            with switch.prevent(Switch.Changed):
                switch.value = on

    def _show_thinking_effect(self) -> None:
        parts = []
        for mode, label in ((False, "off"), (True, "on")):
            rates = self.by_thinking[mode]
            if rates:
                parts.append(f"{label}: {format_rate(sum(rates) / len(rates))}")
        text = "acceptance " + " · ".join(parts) if parts else "applies to the next answer"
        self.query_one("#thinking-effect", Static).update(Text(text, style="dim"))


def _short(value) -> str:
    return str(value).removeprefix("torch.")
