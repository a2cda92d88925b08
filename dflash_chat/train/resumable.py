"""A training loop that can be stopped and started again where it was: long runs on a shared CPU go in chunks.

Every `save_seconds` (and at the chunk's end, or on SIGTERM or SIGINT after the step in flight) it writes a
checkpoint atomically (a temporary file renamed over the last): the weights, AdamW's state, the step, the
data draws' random states and the learning curve so far. Started again with the same checkpoint path, it goes
on from there, and the steps it takes are the ones an uninterrupted run would have taken. Every `eval_every`
steps it appends a row to the curve (the mean losses since the row before, and what `evaluate` measures),
also written as JSON beside the checkpoint. A process paused with SIGSTOP loses nothing: it only waits.

A machine that is handed back loses its folders, so a run that outlives a session is carried in the repository:
`carry` writes the checkpoint's weights in float16 with the step, the curve and the random states, without
AdamW's moments (a sixth of the size: what a commit can hold). A run with no checkpoint that is given the carried
file (`Checkpointing.carried`) starts from it: the same steps and draws follow, its moments start from zero and
its learning rate warms up again over `warmup` steps (AdamW's first updates are as large as the rate allows).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflash_chat.train.common import Log, Schedule, cosine_lr


@dataclass
class Draws:
    """The random sources a step draws its data from (their states go into the checkpoint)."""

    rng: random.Random
    gen: torch.Generator

    @classmethod
    def seeded(cls, seed: int) -> Draws:
        return cls(random.Random(seed), torch.Generator().manual_seed(seed))


# One step's loss and the figures to log beside it (name -> scalar tensor), from the step number and the draws.
StepFn = Callable[[int, Draws], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]


@dataclass
class Checkpointing(Schedule):
    """Where the run's state lives, how often it is saved and measured, and how much of it one chunk takes."""

    path: Path = Path("checkpoint.pt")
    save_seconds: float = 300.0
    eval_every: int = 50
    until: int | None = None  # stop (saving) after this step, as a chunk bound; None: `steps`
    carried: Path | None = None  # a carried run (`carry`) to start from when there is no checkpoint; updated
    # at the end of each chunk


@dataclass
class Progress:
    step: int  # the steps taken, all chunks together
    curve: list[dict] = field(default_factory=list)
    finished: bool = False  # all `steps` taken


def train_resumable(
    model,
    step_fn: StepFn,
    settings: Checkpointing,
    *,
    seed: int,
    evaluate: Callable[[], dict[str, float]] | None = None,
    log: Log = print,
) -> Progress:
    """Train `model` to `settings.steps` steps of `step_fn` (AdamW, warmup then cosine), from the checkpoint at
    `settings.path` when there is one; stops at `settings.until`, past `settings.max_seconds` of this chunk, or
    on SIGTERM/SIGINT, saving first. Returns where it stopped and the curve."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    draws = Draws.seeded(seed)
    state = _load(settings.path, model, opt, draws, log)
    if not state["step"] and settings.carried is not None and settings.carried.exists():
        state = _load_carried(settings.carried, model, draws, log)
    curve_path = settings.path.with_name(settings.path.stem + "_curve.json")

    def measure(step: int) -> None:
        row: dict[str, Any] = {"step": step, "seconds": round(state["seconds"])}
        for key, values in state["pending"].items():
            row[key] = round(sum(values) / len(values), 4) if values else None
        if state["pending"].get("loss"):
            row["step_seconds"] = round(state["step_seconds"] / len(state["pending"]["loss"]), 2)
        if evaluate is not None:
            row.update({k: round(v, 4) for k, v in evaluate().items()})
            model.train()
        state["curve"].append(row)
        state["pending"], state["step_seconds"] = {}, 0.0
        log(f"step {step}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "step"))
        _write_json(curve_path, state["curve"])

    model.train()
    if state["step"] == 0 and not state["curve"]:
        measure(0)
    started = last_save = time.perf_counter()
    end = min(settings.steps, settings.until if settings.until is not None else settings.steps)
    with _stop_requests() as stop:
        while state["step"] < end and not stop:
            if settings.max_seconds is not None and time.perf_counter() - started > settings.max_seconds:
                log(f"stopped by the {settings.max_seconds / 60:.0f}-minute cap of this chunk")
                break
            step_started = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = cosine_lr(
                    state["step"], settings.steps, settings.lr, settings.warmup, settings.min_lr_ratio
                ) * _rewarm(state, settings.warmup)
            loss, figures = step_fn(state["step"], draws)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state["step"] += 1
            took = time.perf_counter() - step_started
            state["seconds"] += took
            state["step_seconds"] += took
            for key, value in {"loss": loss, **figures}.items():
                state["pending"].setdefault(key, []).append(float(value.detach()))
            if state["step"] % settings.log_every == 0:
                log(f"step {state['step']}/{settings.steps} loss {float(loss.detach()):.3f} ({took:.1f}s)")
            if state["step"] % settings.eval_every == 0 or state["step"] == settings.steps:
                measure(state["step"])
            if time.perf_counter() - last_save > settings.save_seconds:
                _save(settings.path, model, opt, draws, state)
                last_save = time.perf_counter()
        if stop:
            log(f"stopped by {stop[0]} after step {state['step']}")
    _save(settings.path, model, opt, draws, state)
    log(f"checkpoint at step {state['step']} of {settings.steps}: {settings.path}")
    if settings.carried is not None:
        carry(settings.path, settings.carried)
        log(f"carried to {settings.carried} (commit it: the next session starts from it)")
    model.eval()
    return Progress(state["step"], state["curve"], state["step"] >= settings.steps)


@contextmanager
def _stop_requests() -> Iterator[list[str]]:
    """A list that SIGTERM or SIGINT puts their name in (the loop stops after the step in flight); the
    handlers before are restored after. Outside the main thread signals cannot be caught: the list stays empty."""
    stop: list[str] = []
    handlers = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            handlers[sig] = signal.signal(sig, lambda number, _: stop.append(signal.Signals(number).name))
    except ValueError:
        pass
    try:
        yield stop
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _load(path: Path, model, opt, draws: Draws, log: Log) -> dict:
    """The loop's state from the checkpoint at `path` (model, optimizer and draws restored), else a new one."""
    if not path.exists():
        return {"step": 0, "seconds": 0.0, "step_seconds": 0.0, "pending": {}, "curve": []}
    saved = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    draws.rng.setstate(saved["rng"])
    draws.gen.set_state(saved["gen"])
    torch.set_rng_state(saved["torch_rng"])
    log(f"resumed from {path} at step {saved['state']['step']}")
    return saved["state"]


def carry(checkpoint: Path, out: Path) -> None:
    """The checkpoint at `checkpoint`, as a carried run at `out` (module docstring), written atomically."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    carried = {
        "model": {name: t.half() if t.is_floating_point() else t for name, t in saved["model"].items()},
        **{key: saved[key] for key in ("rng", "gen", "torch_rng", "state")},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    torch.save(carried, partial)
    os.replace(partial, out)


def _load_carried(path: Path, model, draws: Draws, log: Log) -> dict:
    """The loop's state from a carried run (model and draws restored, the optimizer left new)."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    own = model.state_dict()
    model.load_state_dict({name: t.to(own[name].dtype) for name, t in saved["model"].items()})
    draws.rng.setstate(saved["rng"])
    draws.gen.set_state(saved["gen"])
    torch.set_rng_state(saved["torch_rng"])
    state = {**saved["state"], "carried_at": saved["state"]["step"]}
    log(f"resumed from the carried run {path} at step {state['step']} (AdamW's moments start again)")
    return state


def _rewarm(state: dict, warmup: int) -> float:
    """The learning rate's factor after a start from a carried run: rising again over `warmup` steps."""
    since = state["step"] - state.get("carried_at", -warmup)
    return min(1.0, (since + 1) / max(1, warmup))


def _save(path: Path, model, opt, draws: Draws, state: dict) -> None:
    """The checkpoint written beside `path` and renamed over it: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": draws.rng.getstate(),
        "gen": draws.gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "state": state,
    }
    partial = path.with_name(path.name + ".partial")
    torch.save(saved, partial)
    os.replace(partial, path)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(partial, path)
