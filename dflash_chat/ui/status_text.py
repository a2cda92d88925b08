"""What the chat screen says about the model, worded from a backend's Status (runtime/events.py).

Three places show it: the empty chat's notice (`note`), the title bar (`subtitle`) and the panel's
Model section (`panel_note`); `no_model_yet` is the warning when a message cannot be sent yet.
"""

from __future__ import annotations

from dflash_chat.chat.backends.base import Backend
from dflash_chat.models.sizes import size_text
from dflash_chat.runtime.endpoint import ServedModel
from dflash_chat.runtime.events import Status
from dflash_chat.runtime.model_source import HOW_TO_PICK

DEMO = "tiny built-in demo model"


def note(status: Status) -> str:
    """What is happening, or why nothing runs; '' once a model answers (the demo pair says what it is)."""
    stage, explanation = status.stage, status.explanation
    if stage == "idle":
        return f"No model is loaded: {HOW_TO_PICK}. History and settings work without one."
    if stage == "choosing":
        return "Choosing a model for this machine…"
    if stage == "checking":
        return f"{explanation}\n\nChecking the model files…"
    if stage == "downloading":
        return f"{explanation}\n\nDownloading {status.what} ({size_text(status.size)})…"
    if stage == "not_downloaded":
        return f"{status.what} is not downloaded yet. {status.advice} History and settings work meanwhile."
    if stage == "loading":
        if status.demo:
            return f"Loading the {DEMO} (it knows a little Python, nothing more)…"
        loading = f"Loading {status.what} …"
        return f"{explanation}\n\n{loading}" if explanation else loading
    if stage == "connecting":
        return f"Connecting to {status.what}…"
    if stage == "unavailable":
        return f"No model yet: {status.error}"
    if stage == "failed":
        return f"The model did not load: {status.error}"
    return f"This is the {DEMO}: it knows a little Python, nothing more." if status.demo else ""


def subtitle(status: Status, name: str) -> str:
    """The title bar's model line; `name`: the model's, once it answers."""
    if status.stage == "ready":
        return name
    return {
        "idle": "",
        "choosing": "choosing a model…",
        "checking": "choosing a model…",
        "downloading": "downloading the model…",
        "loading": "loading model…",
        "connecting": f"connecting to {status.what}…",
    }.get(status.stage, "no model")


def panel_note(status: Status, *, remote: bool = False) -> str:
    """The panel's Model section while nothing answers."""
    stage = status.stage
    if stage in ("checking", "downloading"):
        return status.explanation
    if stage == "loading":
        return status.explanation if status.explanation and not status.demo else "loading…"
    if stage == "unavailable":
        return "not connected" if remote else "no model"
    return {
        "choosing": "choosing…",
        "connecting": "connecting…",
        "not_downloaded": "not downloaded",
        "failed": "not loaded",
    }.get(stage, "")


def no_model_yet(status: Status) -> str:
    """Why a message cannot be sent yet, in one line."""
    if status.stage == "idle":
        return f"No model is loaded yet: {HOW_TO_PICK}."
    text = note(status)
    return text.splitlines()[-1] if text else "No model is ready yet."


def ready_text(backend: Backend, seconds: float) -> str:
    """The notification once a model is ready."""
    model = backend.model
    if isinstance(model, ServedModel):
        return f"Connected to {backend.status.what}: {model.id}"
    return f"{backend.name()} is ready ({seconds:.1f} s to load)"
