"""Which model pair the chat runs, decided from the flags and the settings before the UI starts.

In order:
- `--demo`: the tiny built-in demo pair.
- `--target PATH [--drafter PATH] [--mmproj FILE]`: those files (Hugging Face folders or GGUFs), loaded as they
  are, with the vision tower GGUF given (a folder's own tower loads unless the `vision` setting is off); a `model`
  setting that is a path takes `--mmproj` the same way.
- the model-choice flags (--model, --quant, --drafter-quant, --target-file, --drafter-file): a `Pick`
  with them pinned; the model manager (runtime/model_manager.py) chooses the rest at start.
- the `model` setting: a path (one that exists, or is written like one: with a `/`, or starting with
  `~` or `.`) is a model folder or file, run with the `drafter` setting; anything else must be a
  catalog pair name (a `Pick` of it; an unknown name is an error listing the known ones).
- nothing: a `Pick` with nothing pinned: the app probes the machine and takes what fits, the tiny
  demo pair when there is no GPU.
`--context` goes with any of them: the context length to size and load the model for. `--mmproj FILE` goes with
--target or --target-file, and is checked (a Qwen3.5 vision tower GGUF) before anything loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal

from dflash_chat.errors import UserError
from dflash_chat.settings import Settings

HOW_TO_PICK = (
    "start with `dflash-chat --target DIR --drafter DIR`, or save a pair with "
    "`dflash-chat --set model=DIR --set drafter=DIR`"
)
DEVICE_ENV = "DFLASH_CHAT_DEVICE"  # e.g. "cpu": load there whatever the model manager chose


@dataclass(frozen=True)
class ModelSource:
    """Files to load: a target, its drafter and (from a download) the official tokenizer folder."""

    target: str
    drafter: str | None
    demo: bool = False
    tokenizer: str | None = None
    title: str = ""  # what the app calls the model; empty: the loader's name for the files
    target_quant: str = ""
    drafter_quant: str = ""
    device: str | None = None  # where the model manager placed it; None: the loader's default
    context: int | None = None  # context to load for; None: the settings' context_length
    vision: str | None = None  # the vision tower to load: an mmproj GGUF or a model folder; None: see `vision_chosen`
    vision_chosen: bool = False  # the model manager decided (None: leave it unloaded); else a folder target's own

    @property
    def quant_label(self) -> str:
        """'Q4_K_M · drafter Q8_0', or '' when the quants are not known."""
        parts = [self.target_quant] if self.target_quant else []
        if self.drafter and self.drafter_quant:
            parts.append(f"drafter {self.drafter_quant}")
        return " · ".join(parts)


@dataclass(frozen=True)
class Pick:
    """Let the model manager choose at start; each field given is pinned, like the flag of its name."""

    model: str | None = None
    quant: str | None = None
    drafter_quant: str | None = None
    context: int | None = None
    target_file: str | None = None
    drafter_file: str | None = None
    mmproj_file: str | None = None  # the vision tower for the target (--mmproj); not a pin of its own

    @property
    def names_a_model(self) -> bool:
        """A pair or a target file is pinned: run it even without a GPU (no demo fallback)."""
        return self.model is not None or self.target_file is not None

    @property
    def pins_files(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self) if f.name not in ("context", "mmproj_file"))


def pick_from_args(args) -> Pick:
    """The model-choice flags of hardware.add_choice_arguments, as a Pick."""
    return Pick(**{f.name: getattr(args, f.name, None) for f in fields(Pick)})


def load_device(source: ModelSource) -> str | None:
    """$DFLASH_CHAT_DEVICE when set (to force, say, the CPU), else where the source was placed."""
    return os.environ.get(DEVICE_ENV) or source.device


def demo_source() -> ModelSource:
    """The built-in demo pair, with its vision tower where it ships; UserError (saying what to pass instead) when
    this install lacks the pair."""
    from dflash_chat.models.demo import demo_paths, demo_vision

    target, drafter = demo_paths()
    tower = demo_vision()
    return ModelSource(str(target), str(drafter), demo=True, vision=str(tower) if tower else None, vision_chosen=True)


def catalog_name(name: str) -> str:
    """The catalog's name for a pair given by name or title; CatalogError lists the known ones."""
    from dflash_chat.models.catalog import load_catalog

    return load_catalog().get(name).name


def is_model_path(value: str) -> bool:
    """How a `model` value is read: a path (existing, or written like one) or else a catalog name."""
    return value.startswith(("~", ".")) or "/" in value or os.sep in value or Path(value).expanduser().exists()


def model_value(value: str) -> str:
    """A `model` setting as it is saved: a path made absolute (the app may start from another
    folder), a pair by its catalog name (CatalogError if unknown); empty stays empty."""
    if not value:
        return value
    return _absolute(value) if is_model_path(value) else catalog_name(value)


def drafter_value(value: str) -> str:
    """A `drafter` setting as it is saved: the path made absolute; empty stays empty."""
    return _absolute(value) if value else value


def _absolute(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def from_settings(settings: Settings, context: int | None = None) -> ModelSource | Pick:
    """What the `model` and `drafter` settings name (nothing: let the model manager choose)."""
    if not settings.model:
        return Pick(context=context)
    if is_model_path(settings.model):
        return ModelSource(settings.model, settings.drafter or None, context=context)
    return Pick(model=catalog_name(settings.model), context=context)


def resolve(
    settings: Settings,
    *,
    target: str | None = None,
    drafter: str | None = None,
    demo: bool = False,
    pick: Pick | None = None,
) -> ModelSource | Pick:
    pick = pick or Pick()
    if pick.mmproj_file is not None:
        setting_path = bool(settings.model) and is_model_path(settings.model) and not pick.pins_files
        if demo or not (target or pick.target_file or setting_path):
            raise UserError(
                "--mmproj is the vision tower of a target GGUF you point at: give --target or --target-file"
            )
        check_mmproj(pick.mmproj_file, settings.vision)
    if demo:
        if pick.pins_files:
            raise UserError("--demo runs the built-in demo pair; leave out --model/--quant/--*-file with it")
        return replace(demo_source(), context=pick.context)
    if drafter and not target:
        raise UserError("--drafter needs --target too (the drafter runs beside a target model)")
    if target:
        if pick.pins_files:
            raise UserError(
                "--target/--drafter load those files as they are; to let the app pick quants and fetch "
                "what is missing, use --target-file/--drafter-file with --model instead"
            )
        return ModelSource(target, drafter or None, context=pick.context, vision=pick.mmproj_file)
    if pick.pins_files:
        _check_files(pick)
        if pick.model is not None:
            return Pick(**{**pick.__dict__, "model": catalog_name(pick.model)})
        if pick.target_file is None and settings.model and not is_model_path(settings.model):
            return Pick(**{**pick.__dict__, "model": catalog_name(settings.model)})  # flags refine it
        return pick
    chosen = from_settings(settings, pick.context)
    if isinstance(chosen, ModelSource) and pick.mmproj_file is not None:  # the `model` setting's file, with its tower
        return replace(chosen, vision=pick.mmproj_file)
    return chosen


def vision_to_load(source: ModelSource, setting: str) -> str | Literal[False] | None:
    """The vision tower to load with `source` (engine/load.py load_pair's `vision`): what the model manager chose or
    --mmproj named; False for none (the setting is off, or the model manager left it out); None for files loaded as
    they are, whose folder's own tower then loads (a GGUF has none)."""
    if setting == "off":
        return False
    if source.vision is not None:
        return source.vision
    return False if source.vision_chosen else None


def check_mmproj(path: str, vision: str) -> None:
    """--mmproj: a file that holds a Qwen3.5 vision tower (its GGUF header read, nothing loaded), with vision on;
    a one-line UserError otherwise."""
    from dflash_chat.engine.errors import ModelFormatError
    from dflash_chat.engine.weights.mmproj_header import read_mmproj_header

    if vision == "off":
        raise UserError(f"--mmproj {path} gives a vision tower, and the vision setting is off: add --vision auto")
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(
            f"--mmproj {path}: {'a folder' if file.is_dir() else 'no such file'}; give the mmproj-*.gguf file"
        )
    try:
        read_mmproj_header(file)
    except ModelFormatError as exc:
        raise UserError(f"--mmproj {exc}") from None


def _check_files(pick: Pick) -> None:
    for flag, value in (("--target-file", pick.target_file), ("--drafter-file", pick.drafter_file)):
        if value is not None and not Path(value).expanduser().exists():
            raise UserError(f"{flag} {value}: no such file or folder. Check the path.")
