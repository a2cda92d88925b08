"""Running figures for the side panel while an answer streams.

The engine's GenerationStats arrive only with Finished; until then the panel
shows these, counted from the same Prefilled and Step events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_chat.engine.events import AcceptanceFigures, MethodStats, Prefilled, Step

RECENT_STEPS = 48  # how many acceptance lengths the sparkline keeps


@dataclass
class LiveStats(AcceptanceFigures):
    prompt_tokens: int = 0
    reused_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    ttft_s: float | None = None
    decode_s: float = 0.0  # since the first new token
    recent_lengths: list[int] = field(default_factory=list)  # tokens committed per decode step
    draft: str = ""  # the draft setting ("auto", "off", "7"); "" when not known (a server's answer)
    last_drafted: int = 0  # drafts the latest decode step verified (what `auto` uses now)
    methods: dict[str, MethodStats] = field(default_factory=dict)  # per drafting method ("plain" too), as the engine's

    def on_prefilled(self, event: Prefilled) -> None:
        self.prompt_tokens = event.prompt_tokens
        self.reused_tokens = event.reused_tokens

    def on_step(self, event: Step, since_start_s: float) -> None:
        self.new_tokens += len(event.token_ids)
        if self.ttft_s is None:
            # the engine's first Step is the token the prefill produced, not a decode step
            self.ttft_s = since_start_s
            return
        self.steps += 1
        self.drafted += event.drafted
        self.last_drafted = event.drafted
        self.accepted += event.accepted
        self.decode_s = since_start_s - self.ttft_s
        self.recent_lengths.append(len(event.token_ids))
        del self.recent_lengths[:-RECENT_STEPS]
        figures = self.methods.setdefault(event.method, MethodStats())
        figures.steps += 1
        figures.drafted += event.drafted
        figures.accepted += event.accepted

    def snapshot(self) -> LiveStats:
        methods = {name: MethodStats(**vars(figures)) for name, figures in self.methods.items()}
        return LiveStats(**{**self.__dict__, "recent_lengths": list(self.recent_lengths), "methods": methods})
