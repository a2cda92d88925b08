"""How an answer is sampled and where it stops: one frozen value, with no torch.

It is made once, from the user's settings in the app (Settings.sampling), from the request body in
`serve`, from the flags in `run`, and reaches the engine's step unchanged: nothing re-packs it into loose
fields on the way. A new knob is a field here, its rule in engine/rules.py and its use in
engine/sampling.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dflash_chat.engine import rules

_RULES = {
    "temperature": rules.TEMPERATURE,
    "top_p": rules.TOP_P,
    "top_k": rules.TOP_K,
    "min_p": rules.MIN_P,
    "max_new_tokens": rules.MAX_NEW_TOKENS,
    "seed": rules.SEED,
}


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Temperature, then top-k, top-p and min-p, as transformers applies them (engine/sampling.py); greedy
    at temperature 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0  # drop tokens less likely than min_p times the likeliest one
    max_new_tokens: int | None = 512  # None: up to the end of the context
    seed: int | None = None
    stop: tuple[str, ...] = ()  # text that ends the answer before it (runtime/stops.py)
    stop_token_ids: tuple[int, ...] = ()  # ids that end it, beside the model's own end-of-turn ids

    def __post_init__(self) -> None:
        for field in fields(self):
            rule, value = _RULES.get(field.name), getattr(self, field.name)
            if rule is not None and value is not None:
                try:
                    object.__setattr__(self, field.name, rule.check(value))
                except rules.Invalid as exc:
                    raise rules.Invalid(f"{field.name} {exc}") from None

    @classmethod
    def of(cls, source: object, **given) -> SamplingParams:
        """The value from any object that names its fields (the settings, a command's flags), `given` over them:
        a new knob reaches every such source without another line here."""
        found = {field.name: getattr(source, field.name) for field in fields(cls) if hasattr(source, field.name)}
        return cls(**{**found, **given})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
