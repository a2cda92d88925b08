"""Small helpers shared by the training steps, and the one optimisation loop both models train with."""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

Log = Callable[[str], None]
# One step's loss and the extra figures to log (name -> scalar tensor), or None to skip the step.
StepFn = Callable[[int], "tuple[torch.Tensor, dict[str, torch.Tensor]] | None"]


@dataclass
class Schedule:
    """How long and how fast to train: AdamW, linear warmup then cosine decay to min_lr_ratio * lr."""

    steps: int
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.0
    log_every: int = 25
    max_seconds: float | None = None  # safety cap on a shared machine: stop early (and say so) past it


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed Python and torch for a deterministic block (model init)."""
    random.seed(seed)
    torch.manual_seed(seed)
    yield


def cosine_lr(step: int, total: int, peak: float, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def run_steps(
    name: str, params: Iterable[torch.nn.Parameter], schedule: Schedule, step_fn: StepFn, log: Log
) -> list[float]:
    """Train `params` for `schedule.steps` steps of `step_fn`; returns the loss of each step taken.

    Losses stay on the device and reach the host only at log steps (and once at the end), so a GPU
    is never made to wait for the host in between.
    """
    params = list(params)
    opt = torch.optim.AdamW(params, lr=schedule.lr, betas=(0.9, 0.95), weight_decay=schedule.weight_decay)
    losses: list[torch.Tensor] = []
    extras: dict[str, list[torch.Tensor]] = {}
    started = time.perf_counter()
    for step in range(schedule.steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, schedule.steps, schedule.lr, schedule.warmup, schedule.min_lr_ratio)
        result = step_fn(step)
        if result is None:
            continue
        loss, figures = result
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.detach())
        for key, value in figures.items():
            extras.setdefault(key, []).append(value.detach())
        elapsed = time.perf_counter() - started
        if (step + 1) % schedule.log_every == 0 or step + 1 == schedule.steps:
            shown = "".join(f" {key} {_recent_mean(values, schedule.log_every):.2f}" for key, values in extras.items())
            log(
                f"{name} step {step + 1}/{schedule.steps} loss {_recent_mean(losses, schedule.log_every):.3f}"
                f"{shown} ({elapsed:.0f}s)"
            )
        if schedule.max_seconds is not None and elapsed > schedule.max_seconds and step + 1 < schedule.steps:
            log(f"{name}: stopped by the {schedule.max_seconds:.0f}s cap after {step + 1} of {schedule.steps} steps")
            break
    return torch.stack(losses).float().tolist() if losses else []


def _recent_mean(values: list[torch.Tensor], n: int) -> float:
    return torch.stack(values[-n:]).float().mean().item()


def autocast_for(device: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; plain fp32 elsewhere (CPU bf16 matmuls are slow and less exact)."""
    if str(device).startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
