"""Which model pair the chat runs: flags first, then the settings, then the demo pair."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_chat.errors import UserError
from dflash_chat.settings import Settings

HOW_TO_PICK = (
    "start with `dflash-chat --target DIR --drafter DIR`, or save a pair with "
    "`dflash-chat --set model=DIR --set drafter=DIR`"
)


@dataclass(frozen=True)
class ModelSource:
    target: str
    drafter: str | None
    demo: bool = False


def demo_source() -> ModelSource | None:
    try:
        from dflash_chat import demo
    except ModuleNotFoundError:
        return None
    if not demo.demo_available():
        return None
    target, drafter = demo.demo_paths()
    return ModelSource(str(target), str(drafter), demo=True)


def resolve(settings: Settings, *, target: str | None = None, drafter: str | None = None,
            demo: bool = False) -> ModelSource | None:
    if demo:
        source = demo_source()
        if source is None:
            raise UserError(f"the demo model is not part of this build yet; {HOW_TO_PICK}")
        return source
    if drafter and not target:
        raise UserError("--drafter needs --target DIR too (the drafter runs beside a target model)")
    if target:
        return ModelSource(target, drafter or None)
    if settings.model:
        return ModelSource(settings.model, settings.drafter or None)
    return demo_source()
