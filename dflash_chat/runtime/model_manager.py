"""The model manager behind `dflash-chat` with no model named: choose, plan the download, hand over files.

Steps, each run in a model worker of runtime/loader.py (the probe imports torch, planning lists repos on
the Hub), none touching the UI:

    chosen = choose(pick, settings.context_length, vision=settings.vision)  # probe + hardware.choose, or the demo
    plan = plan_files(chosen.choice)                   # which files (the vision tower's where it loads), which cached
    files = hub.download(plan)                         # the DownloadScreen (or pull's bars) when any is missing
    source = source_for(chosen.choice, files)          # what the loader loads

Every failure is a UserError whose message says what is missing and what to do.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from dflash_chat.errors import UserError
from dflash_chat.models import hardware, hub
from dflash_chat.models.catalog import Catalog, load_catalog
from dflash_chat.models.hardware import Choice, Machine
from dflash_chat.runtime import model_source
from dflash_chat.runtime.model_source import ModelSource, Pick


class NoModel(UserError):
    """Nothing can run yet; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class Chosen:
    """A catalog pair + quants (`choice`), or the built-in demo pair (`demo`), and why."""

    explanation: str
    choice: Choice | None = None
    demo: ModelSource | None = None


def choose(
    pick: Pick,
    context: int,
    *,
    machine: Machine | None = None,
    catalog: Catalog | None = None,
    vision: str = "auto",
) -> Chosen:
    """Probe (unless given a machine) and choose. Without a GPU, and no model named, the demo pair. `vision`: the
    setting (whether the pick may load the vision tower where it fits)."""
    machine = machine or hardware.probe()
    if machine.gpu is None and not pick.names_a_model:
        return Chosen(_demo_explanation(machine), demo=_demo(machine, pick))
    choice = hardware.choose(
        machine,
        catalog or load_catalog(),
        model=pick.model,
        quant=pick.quant,
        drafter_quant=pick.drafter_quant,
        context=pick.context or context,
        target_file=pick.target_file,
        drafter_file=pick.drafter_file,
        vision=vision,
        mmproj_file=pick.mmproj_file,
    )
    return Chosen(choice.explanation, choice=choice)


def _no_gpu(machine: Machine) -> str:
    return f"{machine.label}: no GPU" + (f" ({machine.cuda_note})" if machine.cuda_note else "")


def _demo(machine: Machine, pick: Pick) -> ModelSource:
    try:
        demo = model_source.demo_source()
    except UserError as exc:
        raise NoModel(
            f"{_no_gpu(machine)}, and {exc}; "
            "or run a model from `dflash-chat models` on the CPU with `dflash-chat --model NAME` (slow)"
        ) from None
    return replace(demo, context=pick.context)


def _demo_explanation(machine: Machine) -> str:
    return (
        f"{_no_gpu(machine)}, so the tiny built-in demo model; "
        "`dflash-chat --model NAME` runs a real one on the CPU (slow)"
    )


def label(choice: Choice) -> str:
    """'Qwen3.6-27B Q4_K_M + drafter Q8_0', 'Qwen3.8-27B Q4_K_M + DFlash2 drafter Q8_0' (local files by name)."""
    target = choice.target.path.name if choice.target.path else f"{choice.pair.title} {choice.target.quant}"
    if choice.drafter is None:
        return target
    drafter = choice.drafter.path.name if choice.drafter.path else choice.drafter.quant
    shape = choice.drafter.shape
    kind = "DFlash2 drafter" if shape is not None and getattr(shape, "kind", "dflash") == "dflash2" else "drafter"
    return f"{target} + {kind} {drafter}"


def pull_command(choice: Choice) -> str | None:
    """The `dflash-chat pull` that fetches this choice ahead of time (None: its target is a local file)."""
    if choice.target.path is not None:
        return None
    words = ["dflash-chat", "pull", choice.pair.name, "--quant", choice.target.quant]
    if choice.drafter is not None and choice.drafter.path is None:
        words += ["--drafter-quant", choice.drafter.quant]
    if choice.pair.vision is not None and not choice.vision.loads:
        words += ["--vision", "off"]
    return shlex.join(words)


def resume_advice(choice: Choice) -> str:
    pull = pull_command(choice)
    again = "Start dflash-chat again to resume the download"
    return f"{again}, or fetch it from a terminal: `{pull}`." if pull else f"{again}."


def plan_files(choice: Choice, **where) -> hub.Plan:
    """The files of the choice and which are cached (the vision tower's mmproj where the choice loads it, unless it
    is a file on disk or the target's own folder); NoModel (saying what to do) when that fails."""
    tower = choice.vision.source if choice.vision.loads else None
    mmproj = tower if tower is not None and tower.kind == "mmproj" else None
    try:
        return hub.plan(choice.target, choice.drafter, choice.pair.tokenizer, mmproj=mmproj, **where)
    except hub.OfflineError as exc:
        pull = pull_command(choice)
        then = f" For this model: `{pull}`." if pull else " Then start dflash-chat again."
        raise NoModel(f"{label(choice)} is not downloaded yet: {exc}{then}") from None
    except UserError as exc:
        raise NoModel(f"{label(choice)}: {exc}") from None


def source_for(choice: Choice, files: hub.ModelFiles) -> ModelSource:
    tower = choice.vision.source if choice.vision.loads else None
    vision = None
    if tower is not None:
        vision = str(files.mmproj or tower.path or files.target)  # fetched, on disk, or the target folder's own
    return ModelSource(
        target=str(files.target),
        drafter=str(files.drafter) if files.drafter else None,
        tokenizer=str(files.tokenizer),
        title=choice.pair.title,
        target_quant=choice.target.quant,
        drafter_quant=choice.drafter.quant if choice.drafter else "",
        device=choice.device,
        context=choice.context,
        vision=vision,
        vision_chosen=True,
    )
